//! Which images the samples touch (their data is embedded at the end), and
//! the code addresses in them that the trace may need names for (each is
//! resolved once into the image's frame table at the end): every sampled
//! instruction pointer, and every callchain entry, link register and stack
//! word that points into an executable mapping of an image, as a return
//! address would. Runs on the writer thread, for every sample: only the
//! stack words that changed since the thread's previous copy are looked
//! at, and each lookup is a bounds test and a binary search.

use lrnprof_format::{BuildId, ImageMapRecord};
use std::collections::{HashMap, HashSet};

/// Code addresses remembered at most, over all images (about 40 bytes
/// each); past it new ones are counted as left out.
pub(crate) const MAX_ADDRESSES: usize = 1 << 20;

/// Keep at most this many threads' previous stack copies (64 KiB each at
/// most); past it they are forgotten and the next copies scanned whole.
const MAX_PREV_STACKS: usize = 4096;

/// An executable mapping of an image with a build id, in one process.
struct TouchRange {
    start: u64,
    end: u64,
    file_offset: u64,
    /// Index into [`Touched::images`].
    image: usize,
}

/// What the samples touched of one image.
#[derive(Debug)]
pub(crate) struct TouchedImage {
    pub id: BuildId,
    pub touched: bool,
    /// Lookup addresses (file offsets) of sampled instruction pointers.
    pub ips: HashSet<u64>,
    /// Lookup addresses (file offsets) of possible return addresses
    /// (minus one, inside the call instruction).
    pub returns: HashSet<u64>,
    /// Addresses not remembered, past [`MAX_ADDRESSES`].
    pub left_out: u64,
}

impl TouchedImage {
    /// The lookup addresses to resolve, most important first: instruction
    /// pointers (the leaves every profile shows), then return addresses,
    /// each group sorted.
    pub fn lookups(&self) -> Vec<u64> {
        let mut ips: Vec<u64> = self.ips.iter().copied().collect();
        ips.sort_unstable();
        let mut returns: Vec<u64> = self
            .returns
            .iter()
            .copied()
            .filter(|a| !self.ips.contains(a))
            .collect();
        returns.sort_unstable();
        ips.extend(returns);
        ips
    }
}

/// What samples touched, for embedding.
#[derive(Default)]
pub(crate) struct Touched {
    /// Whether code addresses are remembered (for frame tables), not only
    /// which images were touched.
    collect: bool,
    /// Per process: its mappings sorted by start. Rebuilt when dirty.
    index: HashMap<u32, Vec<TouchRange>>,
    dirty: HashSet<u32>,
    pub images: Vec<TouchedImage>,
    image_ids: HashMap<BuildId, usize>,
    addresses: usize,
    /// Each thread's previous stack copy (start AVMA, bytes), so only the
    /// words that changed are looked up.
    prev_stacks: HashMap<(u32, u32), (u64, Vec<u8>)>,
}

/// What one sample refers to.
pub(crate) struct SampleRefs<'a> {
    pub pid: u32,
    pub tid: u32,
    /// Instruction pointer.
    pub ip: u64,
    /// AArch64 link register (a return address until the leaf saves it).
    pub lr: Option<u64>,
    /// The kernel's callchain, innermost first, markers removed.
    pub callchain: &'a [u64],
    /// AVMA of the stack copy's first byte.
    pub sp: u64,
    /// The stack copy.
    pub stack: &'a [u8],
}

impl Touched {
    /// Nothing touched yet; with `collect`, code addresses are remembered.
    pub fn new(collect: bool) -> Touched {
        Touched {
            collect,
            ..Touched::default()
        }
    }

    /// Process `pid`'s mappings changed (or it is gone).
    pub fn mappings_changed(&mut self, pid: u32) {
        self.index.remove(&pid);
        self.dirty.insert(pid);
    }

    /// Note what a sample refers to. `maps` are the executable mappings
    /// of each process. Unchanged stack words were looked up when they
    /// first appeared; every copy is scanned whole again after its
    /// process's mappings change.
    pub fn sample(&mut self, maps: &HashMap<u32, Vec<ImageMapRecord>>, s: &SampleRefs<'_>) {
        let (pid, tid) = (s.pid, s.tid);
        if self.dirty.contains(&pid) {
            self.prev_stacks.retain(|&(p, _), _| p != pid);
        }
        let prev = self.prev_stacks.remove(&(pid, tid));
        // Return addresses are looked up one byte back, inside their call.
        // The callchain starts with the instruction pointer itself.
        let chain = match s.callchain.split_first() {
            Some((&first, rest)) if first == s.ip => rest,
            _ => s.callchain,
        };
        let returns = chain
            .iter()
            .copied()
            .chain(s.lr)
            .chain(changed_words(s.sp, s.stack, prev.as_ref()))
            .map(|a| a.wrapping_sub(1));
        self.touch(
            maps,
            pid,
            std::iter::once((s.ip, true)).chain(returns.map(|a| (a, false))),
        );
        let mut bytes = prev.map(|(_, b)| b).unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(s.stack);
        if self.prev_stacks.len() >= MAX_PREV_STACKS {
            self.prev_stacks.clear();
        }
        self.prev_stacks.insert((pid, tid), (s.sp, bytes));
    }

    /// Note that process `pid` refers to each of `lookups` (AVMA, whether
    /// it is an instruction pointer).
    pub fn touch(
        &mut self,
        maps: &HashMap<u32, Vec<ImageMapRecord>>,
        pid: u32,
        lookups: impl IntoIterator<Item = (u64, bool)>,
    ) {
        if self.dirty.remove(&pid) || !self.index.contains_key(&pid) {
            let ranges = self.ranges_of(maps.get(&pid).map_or(&[][..], |m| &m[..]));
            self.index.insert(pid, ranges);
        }
        let Some(ranges) = self.index.get(&pid) else {
            return;
        };
        let (Some(lo), Some(hi)) = (
            ranges.first().map(|r| r.start),
            ranges.iter().map(|r| r.end).max(),
        ) else {
            return;
        };
        for (addr, is_ip) in lookups {
            if addr < lo || addr >= hi {
                continue;
            }
            let i = ranges.partition_point(|r| r.start <= addr);
            let Some(r) = i.checked_sub(1).map(|i| &ranges[i]) else {
                continue;
            };
            if addr >= r.end {
                continue;
            }
            let image = &mut self.images[r.image];
            image.touched = true;
            if !self.collect {
                continue;
            }
            let offset = addr - r.start + r.file_offset;
            let set = if is_ip {
                &mut image.ips
            } else {
                &mut image.returns
            };
            if set.contains(&offset) {
                continue;
            }
            if self.addresses >= MAX_ADDRESSES {
                image.left_out += 1;
                continue;
            }
            set.insert(offset);
            self.addresses += 1;
        }
    }

    /// The index of `maps` (executable mappings with a build id).
    fn ranges_of(&mut self, maps: &[ImageMapRecord]) -> Vec<TouchRange> {
        let mut ranges: Vec<TouchRange> = maps
            .iter()
            .filter_map(|m| {
                let id = m.build_id.as_ref()?;
                let image = match self.image_ids.get(id) {
                    Some(&i) => i,
                    None => {
                        self.images.push(TouchedImage {
                            id: id.clone(),
                            touched: false,
                            ips: HashSet::new(),
                            returns: HashSet::new(),
                            left_out: 0,
                        });
                        self.image_ids.insert(id.clone(), self.images.len() - 1);
                        self.images.len() - 1
                    }
                };
                Some(TouchRange {
                    start: m.start,
                    end: m.end,
                    file_offset: m.file_offset,
                    image,
                })
            })
            .collect();
        ranges.sort_by_key(|r| r.start);
        ranges
    }

    /// What the samples touched of image `id`.
    pub fn image(&self, id: &BuildId) -> Option<&TouchedImage> {
        self.image_ids.get(id).map(|&i| &self.images[i])
    }

    /// The build ids of the images touched, sorted.
    pub fn touched_ids(&self) -> Vec<&BuildId> {
        let mut ids: Vec<&BuildId> = self
            .images
            .iter()
            .filter(|i| i.touched)
            .map(|i| &i.id)
            .collect();
        ids.sort();
        ids
    }
}

/// The words of `stack` (starting at AVMA `sp`) that differ from the
/// previous copy `prev` at the same address, as native-endian values.
fn changed_words<'a>(
    sp: u64,
    stack: &'a [u8],
    prev: Option<&'a (u64, Vec<u8>)>,
) -> impl Iterator<Item = u64> + 'a {
    stack.chunks_exact(8).enumerate().filter_map(move |(i, w)| {
        let addr = sp.wrapping_add(8 * i as u64);
        let same = prev.is_some_and(|(start, bytes)| {
            addr.checked_sub(*start)
                .filter(|off| off.is_multiple_of(8))
                .and_then(|off| usize::try_from(off).ok())
                .and_then(|off| bytes.get(off..off + 8))
                .is_some_and(|p| p == w)
        });
        (!same).then(|| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::{ImageKind, Pid, Timestamp};

    fn map(pid: u32, start: u64, end: u64, id: u8) -> ImageMapRecord {
        ImageMapRecord {
            time: Timestamp(1),
            pid: Pid(pid),
            start,
            end,
            file_offset: 0x1000,
            path: format!("/lib{id}.so"),
            build_id: Some(BuildId(vec![id])),
            kind: ImageKind::File,
            executable: true,
        }
    }

    fn maps(list: &[ImageMapRecord]) -> HashMap<u32, Vec<ImageMapRecord>> {
        let mut m: HashMap<u32, Vec<ImageMapRecord>> = HashMap::new();
        for r in list {
            m.entry(r.pid.0).or_default().push(r.clone());
        }
        m
    }

    fn touched(t: &Touched) -> Vec<u8> {
        t.touched_ids().iter().map(|id| id.0[0]).collect()
    }

    #[test]
    fn touches_find_the_image_holding_an_address() {
        let mut t = Touched::new(true);
        let m = maps(&[map(1, 0x1000, 0x2000, 1), map(1, 0x5000, 0x6000, 2)]);
        t.touch(&m, 1, [(0x5fff, true), (0x3000, false)]); // in image 2; between images
        t.touch(&m, 2, [(0x1000, true)]); // another process
        assert_eq!(touched(&t), [2]);
        // File offsets: the mapping starts at file offset 0x1000.
        let two = t.image(&BuildId(vec![2])).unwrap();
        assert_eq!(two.lookups(), [0x1fff]);
        // A new mapping over the first replaces it.
        let m = maps(&[map(1, 0x1000, 0x2000, 3), map(1, 0x5000, 0x6000, 2)]);
        t.mappings_changed(1);
        t.touch(&m, 1, [(0x1800, false)]);
        assert_eq!(touched(&t), [2, 3]);
    }

    #[test]
    fn samples_give_instruction_pointers_and_return_addresses() {
        let mut t = Touched::new(true);
        let m = maps(&[map(1, 0x1000, 0x2000, 1)]);
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let stack = words(&[0x1234, 0x9999, 0x1001]);
        t.sample(
            &m,
            &SampleRefs {
                pid: 1,
                tid: 7,
                ip: 0x1100,
                lr: Some(0x1400),
                callchain: &[0x1100, 0x1500],
                sp: 0x8000,
                stack: &stack,
            },
        );
        let one = t.image(&BuildId(vec![1])).unwrap();
        // The ip as it is (the callchain's first entry is the ip again),
        // return addresses one byte back.
        assert_eq!(one.lookups(), [0x1100, 0x1000, 0x1233, 0x13ff, 0x14ff]);
        // Without collecting, only which images were touched.
        let mut t = Touched::new(false);
        t.touch(&m, 1, [(0x1100, true)]);
        assert_eq!(touched(&t), [1]);
        assert!(t.image(&BuildId(vec![1])).unwrap().lookups().is_empty());
    }

    #[test]
    fn only_changed_stack_words_are_looked_up_until_the_images_change() {
        let mut t = Touched::new(false);
        let mut list = vec![map(1, 0x1000, 0x2000, 1)];
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let sample = |t: &mut Touched, list: &[ImageMapRecord], sp: u64, w: &[u64]| {
            let stack = words(w);
            t.sample(
                &maps(list),
                &SampleRefs {
                    pid: 1,
                    tid: 7,
                    ip: 0,
                    lr: None,
                    callchain: &[],
                    sp,
                    stack: &stack,
                },
            );
        };
        // First copy: a word into image 1 is found.
        sample(&mut t, &list, 0x8000, &[0x1234, 0x9999]);
        assert_eq!(touched(&t), [1]);
        // Image 2 is mapped where an unchanged word of the next copy
        // already pointed: the images changed, so the copy is scanned whole.
        list.push(map(1, 0x9000, 0xa000, 2));
        t.mappings_changed(1);
        sample(&mut t, &list, 0x8000, &[0x1234, 0x9999]);
        assert_eq!(touched(&t), [1, 2]);
        // Words equal to the previous copy's at the same address are skipped,
        // changed and new words are looked up (here, one sp lower).
        list.push(map(1, 0xb000, 0xc000, 3));
        t.mappings_changed(1);
        sample(&mut t, &list, 0x8000, &[0x1234, 0x9999]);
        list.push(map(1, 0xd000, 0xe000, 4));
        t.mappings_changed(1);
        sample(&mut t, &list, 0x8000, &[0x1234, 0x9999]);
        assert_eq!(touched(&t), [1, 2]);
        sample(&mut t, &list, 0x7ff8, &[0xb010, 0x1234, 0x9999]);
        assert_eq!(touched(&t), [1, 2, 3]);
        // changed_words itself: only the differing, aligned words.
        let prev = (0x100u64, words(&[1, 2, 3]));
        let changed: Vec<u64> = changed_words(0xf8, &words(&[9, 1, 5, 3]), Some(&prev)).collect();
        assert_eq!(changed, vec![9, 5]);
        let misaligned: Vec<u64> = changed_words(0x104, &words(&[1, 2]), Some(&prev)).collect();
        assert_eq!(misaligned, vec![1, 2]);
    }
}
