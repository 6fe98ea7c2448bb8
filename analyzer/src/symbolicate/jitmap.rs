//! `perf-PID.map` JIT symbol files: one `START SIZE NAME` line per
//! function, addresses in hex (AVMA).

use crate::address::Avma;

/// A parsed JIT map, sorted by start address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JitMap {
    entries: Vec<(u64, u64, String)>,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x").trim_start_matches("0X"), 16).ok()
}

impl JitMap {
    /// Parse the text of a map; lines that do not parse are skipped.
    pub fn parse(text: &str) -> JitMap {
        let mut entries: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.trim().splitn(3, ' ');
                let start = hex(parts.next()?)?;
                let size = hex(parts.next()?)?;
                let name = parts.next()?.trim().to_string();
                Some((start, size, name))
            })
            .collect();
        // Later lines win for the same start (code regenerated in place).
        entries.reverse();
        entries.sort_by_key(|e| e.0);
        entries.dedup_by_key(|e| e.0);
        JitMap { entries }
    }

    /// The function covering `avma`.
    pub fn lookup(&self, avma: Avma) -> Option<&str> {
        let Avma(avma) = avma;
        let i = self
            .entries
            .partition_point(|e| e.0 <= avma)
            .checked_sub(1)?;
        let (start, size, name) = &self.entries[i];
        (avma - start < (*size).max(1)).then_some(name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_lookup() {
        let m = JitMap::parse("7f0000001000 40 JIT foo\n0x7f0000002000 0x10 bar\ngarbage\n");
        assert_eq!(m.lookup(Avma(0x7f0000001000)), Some("JIT foo"));
        assert_eq!(m.lookup(Avma(0x7f000000103f)), Some("JIT foo"));
        assert_eq!(m.lookup(Avma(0x7f0000001040)), None);
        assert_eq!(m.lookup(Avma(0x7f000000200f)), Some("bar"));
        assert_eq!(m.lookup(Avma(0x10)), None);
    }
}
