//! gzip compressed in pieces on the current rayon pool's workers.
//!
//! The input is cut into pieces of [`PIECE`] bytes, each compressed on its
//! own as raw deflate with the 32 KiB before it as its dictionary, and the
//! pieces are joined into one gzip member: every piece but the last ends
//! with a sync flush (a byte-aligned, non-final empty block), so the
//! deflate streams follow one another as one. The CRC-32 of the pieces are
//! combined in order. With the window as dictionary, matches reach into
//! the previous piece as a single stream's would, and the output is a few
//! bytes per piece larger than one stream's. The pieces do not depend on
//! the number of workers: the same input gives the same bytes with any
//! `--jobs`.
//!
//! The crate flate2 compresses one stream on one thread; on a python
//! profile of 316 KB, gzip was a third of what the analysis did on one
//! thread after unwinding.

use flate2::{Compress, Compression, FlushCompress, Status};
use rayon::prelude::*;
use std::io::{self, Write};

/// Input bytes per piece.
const PIECE: usize = 64 << 10;

/// deflate's window: the bytes before a piece given as its dictionary.
const WINDOW: usize = 32 << 10;

/// Pieces compressed before their bytes are written (4 MiB of input).
const BATCH: usize = 64;

/// Write `data` gzipped at `level` to `out`, as one gzip member with no
/// file name and mtime 0.
pub(crate) fn write_gzip(data: &[u8], level: Compression, out: &mut dyn Write) -> io::Result<()> {
    let starts: Vec<usize> = (0..data.len().max(1)).step_by(PIECE).collect();
    out.write_all(&header(level))?;
    let mut crc = crc32fast::Hasher::new();
    // A batch of pieces at a time: the compressed bytes held at once stay
    // bounded however large the profile.
    for batch in starts.chunks(BATCH) {
        let pieces = batch
            .par_iter()
            .map(|&start| {
                let end = (start + PIECE).min(data.len());
                let dictionary = &data[start.saturating_sub(WINDOW)..start];
                let mut crc = crc32fast::Hasher::new();
                crc.update(&data[start..end]);
                let deflated = deflate(&data[start..end], dictionary, end == data.len(), level)?;
                Ok((deflated, crc))
            })
            .collect::<io::Result<Vec<_>>>()?;
        for (deflated, piece_crc) in &pieces {
            out.write_all(deflated)?;
            crc.combine(piece_crc);
        }
    }
    out.write_all(&crc.finalize().to_le_bytes())?;
    // ISIZE: the input's length modulo 2^32.
    out.write_all(&(data.len() as u32).to_le_bytes())
}

/// `input` as raw deflate, matches reaching into `dictionary` (the bytes
/// just before it); the final block if `last`, else ended by a sync flush.
fn deflate(input: &[u8], dictionary: &[u8], last: bool, level: Compression) -> io::Result<Vec<u8>> {
    let error = |e: flate2::CompressError| io::Error::other(e);
    let mut c = Compress::new(level, false);
    if !dictionary.is_empty() {
        c.set_dictionary(dictionary).map_err(error)?;
    }
    let flush = if last {
        FlushCompress::Finish
    } else {
        FlushCompress::Sync
    };
    let mut out = Vec::with_capacity(input.len() / 2 + 64);
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity().max(4096));
        }
        let consumed = c.total_in() as usize;
        let status = c
            .compress_vec(&input[consumed..], &mut out, flush)
            .map_err(error)?;
        let all_in = c.total_in() as usize == input.len();
        // A flush is complete when it returns with output space left.
        let done = match status {
            Status::StreamEnd => true,
            Status::Ok | Status::BufError => !last && all_in && out.len() < out.capacity(),
        };
        if done {
            return Ok(out);
        }
    }
}

/// The 10-byte gzip header: deflate, no flags, mtime 0, the extra flags
/// for `level`, unknown operating system (as flate2 writes it).
fn header(level: Compression) -> [u8; 10] {
    let xfl = if level.level() >= Compression::best().level() {
        2
    } else if level.level() <= Compression::fast().level() {
        4
    } else {
        0
    };
    [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, xfl, 255]
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;
    use std::io::Read;

    /// Compressible bytes with some variety: numbers and words, as a
    /// profile's strings and varints are.
    fn text(len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 32);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        while v.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let word = ["frame", "python", "_PyEval", "libc.so.6", "main"][(x % 5) as usize];
            v.extend_from_slice(format!("{word}:{} ", x % 1000).as_bytes());
        }
        v.truncate(len);
        v
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_gzip(data, Compression::new(2), &mut out).unwrap();
        out
    }

    fn gunzip(gz: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        // GzDecoder reads one member and checks its CRC-32 and length.
        let mut d = GzDecoder::new(gz);
        d.read_to_end(&mut out).unwrap();
        assert!(d.into_inner().is_empty(), "bytes after the gzip member");
        out
    }

    #[test]
    fn round_trips_at_piece_boundaries() {
        for len in [
            0,
            1,
            100,
            PIECE - 1,
            PIECE,
            PIECE + 1,
            2 * PIECE,
            3 * PIECE + 17,
            WINDOW / 2,
            BATCH * PIECE,
            BATCH * PIECE + 1,
            (BATCH + 1) * PIECE + 99,
        ] {
            let data = text(len);
            assert_eq!(gunzip(&gzip(&data)), data, "{len} bytes");
        }
    }

    #[test]
    fn round_trips_incompressible_bytes() {
        let mut x = 1u32;
        let data: Vec<u8> = (0..3 * PIECE + 5)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 24) as u8
            })
            .collect();
        assert_eq!(gunzip(&gzip(&data)), data);
    }

    #[test]
    fn the_same_bytes_with_any_number_of_workers() {
        let data = text(5 * PIECE + 123);
        let with = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| gzip(&data))
        };
        let one = with(1);
        assert_eq!(with(2), one);
        assert_eq!(with(3), one);
    }

    #[test]
    fn pieces_use_the_window_before_them() {
        // A long repeat spanning the pieces: with the previous piece as
        // dictionary, each piece is a few back-references; without it,
        // every piece would restart from literals.
        let unit = text(4096);
        let data: Vec<u8> = unit.iter().copied().cycle().take(8 * PIECE).collect();
        let mut single = flate2::write::GzEncoder::new(Vec::new(), Compression::new(2));
        single.write_all(&data).unwrap();
        let single = single.finish().unwrap();
        let pieces = gzip(&data);
        assert_eq!(gunzip(&pieces), data);
        let independent: usize = data
            .chunks(PIECE)
            .map(|c| deflate(c, &[], false, Compression::new(2)).unwrap().len())
            .sum();
        assert!(
            pieces.len() < single.len() + 8 * 16,
            "{} bytes in pieces, {} in one stream",
            pieces.len(),
            single.len()
        );
        assert!(
            pieces.len() * 2 < independent,
            "{} bytes with dictionaries, {independent} without",
            pieces.len()
        );
    }

    #[test]
    fn header_is_flate2s() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), Compression::new(2));
        gz.write_all(b"x").unwrap();
        let theirs = gz.finish().unwrap();
        assert_eq!(&gzip(b"x")[..10], &theirs[..10]);
    }
}
