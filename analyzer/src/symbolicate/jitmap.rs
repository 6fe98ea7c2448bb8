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

    /// Parse `/proc/kallsyms` text (`ADDRESS TYPE NAME [MODULE]` lines):
    /// its code symbols, each up to the next one's address. Module symbols
    /// are named `NAME [MODULE]`; hidden (zero) addresses are skipped.
    pub fn parse_kallsyms(text: &str) -> JitMap {
        let mut starts: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_ascii_whitespace();
                let start = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                let name = match fields.next() {
                    Some(module) => format!("{name} {module}"),
                    None => name.to_string(),
                };
                (start != 0 && matches!(kind, "t" | "T" | "w" | "W")).then_some((start, name))
            })
            .collect();
        starts.sort();
        starts.dedup_by_key(|e| e.0);
        let ends: Vec<u64> = starts.iter().skip(1).map(|e| e.0).collect();
        let entries = starts
            .into_iter()
            .enumerate()
            .map(|(i, (start, name))| {
                // The last symbol's end is unknown: only its own address.
                let size = ends.get(i).map_or(1, |end| end - start);
                (start, size, name)
            })
            .collect();
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
    fn kallsyms_symbols_reach_the_next_one() {
        let m = JitMap::parse_kallsyms(
            "ffffffff81002000 T ksys_write\n\
             ffffffff81001000 D some_data\n\
             ffffffff81003000 T vfs_write\n\
             ffffffffc0001000 t ext4_thing\t[ext4]\n\
             0000000000000000 T hidden\n",
        );
        assert_eq!(m.lookup(Avma(0xffff_ffff_8100_2fff)), Some("ksys_write"));
        assert_eq!(m.lookup(Avma(0xffff_ffff_8100_3010)), Some("vfs_write"));
        assert_eq!(
            m.lookup(Avma(0xffff_ffff_c000_1000)),
            Some("ext4_thing [ext4]")
        );
        assert_eq!(
            m.lookup(Avma(0xffff_ffff_c000_1001)),
            None,
            "last: no known end"
        );
        assert_eq!(
            m.lookup(Avma(0xffff_ffff_8100_1000)),
            None,
            "data symbols skipped"
        );
    }

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
