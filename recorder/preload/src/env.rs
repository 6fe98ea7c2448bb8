//! Finding [`ENV_VAR`](crate::protocol::ENV_VAR) without allocating: in
//! the C library's `environ` once it is set up, or, for allocations made
//! before that, in `/proc/self/environ` read a buffer at a time.

use crate::protocol::ENV_VAR;

/// The value of an environment entry `NAME=VALUE` if NAME is ours.
pub fn value_of(entry: &[u8]) -> Option<&[u8]> {
    let rest = entry.strip_prefix(ENV_VAR.as_bytes())?;
    rest.strip_prefix(b"=")
}

/// Longest value kept (ours is `FD:COOKIE`, about 26 bytes).
const VALUE_MAX: usize = 40;

/// Scans NUL-separated `NAME=VALUE` entries fed in pieces of any size.
#[derive(Debug, Clone)]
pub struct Scanner {
    /// Bytes of the current entry matched against `ENV_VAR=`, or `None`
    /// once the entry is known not to be ours.
    matched: Option<usize>,
    value: [u8; VALUE_MAX],
    len: usize,
    found: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            matched: Some(0),
            value: [0; VALUE_MAX],
            len: 0,
            found: false,
        }
    }
}

impl Scanner {
    /// Feed the next piece; `true` once our entry is complete.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        let name_len = ENV_VAR.len() + 1;
        for &b in bytes {
            if b == 0 {
                if self.matched.is_some_and(|m| m >= name_len) {
                    self.found = true;
                    return true;
                }
                self.matched = Some(0);
                self.len = 0;
                continue;
            }
            self.matched = match self.matched {
                Some(m) if m < name_len => {
                    let want = ENV_VAR.as_bytes().get(m).copied().unwrap_or(b'=');
                    (b == want).then_some(m + 1)
                }
                Some(m) => {
                    if self.len < VALUE_MAX {
                        self.value[self.len] = b;
                        self.len += 1;
                    }
                    Some(m + 1)
                }
                None => None,
            };
        }
        false
    }

    /// Our entry's value, if found (or still being read when the data
    /// ended without a final NUL).
    pub fn value(&self) -> Option<&[u8]> {
        let name_len = ENV_VAR.len() + 1;
        (self.found || self.matched.is_some_and(|m| m >= name_len)).then(|| &self.value[..self.len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_matched_by_whole_name() {
        assert_eq!(value_of(b"LRNPROF_HEAP=3:x"), Some(&b"3:x"[..]));
        assert_eq!(value_of(b"LRNPROF_HEAPS=3:x"), None);
        assert_eq!(value_of(b"XLRNPROF_HEAP=3:x"), None);
    }

    #[test]
    fn the_scanner_finds_the_value_across_pieces() {
        let env = b"PATH=/bin\0X_LRNPROF_HEAP=no\0LRNPROF_HEA=no\0LRNPROF_HEAP=12:00ff\0HOME=/\0";
        for piece in 1..env.len() {
            let mut s = Scanner::default();
            let found = env.chunks(piece).any(|c| s.feed(c));
            assert!(found, "pieces of {piece}");
            assert_eq!(s.value(), Some(&b"12:00ff"[..]));
        }
        let mut s = Scanner::default();
        assert!(!s.feed(b"A=1\0B=2\0"));
        assert_eq!(s.value(), None);
        let mut s = Scanner::default();
        assert!(!s.feed(b"A=1\0LRNPROF_HEAP=7:ab"));
        assert_eq!(s.value(), Some(&b"7:ab"[..]), "no final NUL");
    }
}
