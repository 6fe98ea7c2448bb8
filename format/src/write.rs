//! Streaming trace writer.

use crate::block::{encode_index, BlockBuilder, EncodedBlock, IndexEntry};
use crate::error::FormatError;
use crate::raw::{footer_bytes, FileHeader, VERSION};
use crate::records::{Record, Sample};
use crate::stack::StackHint;
use crate::types::TraceHeader;
use bincode::Options;
use std::io::Write;

/// Options of a [`TraceWriter`].
#[derive(Debug, Clone, Copy)]
pub struct WriterOptions {
    /// Start a new block once this many bytes of records (before compression)
    /// are buffered. Smaller blocks lose less when the recorder is killed and
    /// parallelize better; larger blocks compress better.
    pub block_size: usize,
    /// zstd compression level.
    pub zstd_level: i32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            block_size: 1 << 20,
            zstd_level: 3,
        }
    }
}

/// Writes a trace: the file header at creation, then blocks as records
/// arrive, then the index and footer at [`finish`](Self::finish).
///
/// Memory is bounded by one block. Each block is written and flushed to `out`
/// as a whole, so a writer that dies leaves a trace readable up to its last
/// whole block. A trace without the footer reads as not finished cleanly.
///
/// ```
/// use lrnprof_format::{Record, Summary, TraceHeader, TraceReader, TraceWriter, WriterOptions};
/// let mut out = Vec::new();
/// let mut w = TraceWriter::new(&mut out, &TraceHeader::example(), WriterOptions::default())?;
/// w.write(&Record::Summary(Summary::default()))?;
/// w.finish()?;
/// let reader = TraceReader::new(out)?;
/// assert!(reader.report().finished);
/// assert_eq!(reader.records().count(), 1);
/// # Ok::<(), lrnprof_format::FormatError>(())
/// ```
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: W,
    options: WriterOptions,
    builder: BlockBuilder,
    offset: u64,
    index: Vec<IndexEntry>,
}

impl<W: Write> TraceWriter<W> {
    /// Write the file header to `out` and return a writer for the body.
    pub fn new(
        mut out: W,
        header: &TraceHeader,
        options: WriterOptions,
    ) -> Result<TraceWriter<W>, FormatError> {
        let encoded = encode_header(header)?;
        let fixed = FileHeader {
            version: VERSION,
            flags: 0,
            header_len: encoded.len() as u32,
            header_crc: crc32fast::hash(&encoded),
        };
        out.write_all(&fixed.to_bytes())?;
        out.write_all(&encoded)?;
        out.flush()?;
        Ok(TraceWriter {
            out,
            options,
            builder: BlockBuilder::new(),
            offset: (crate::raw::FILE_HEADER_LEN + encoded.len()) as u64,
            index: Vec::new(),
        })
    }

    /// Buffer a record; writes a block when the buffer is full.
    pub fn write(&mut self, record: &Record) -> Result<(), FormatError> {
        self.write_hinted(record, None)
    }

    /// [`write`](Self::write) with what the caller knows of a sample's
    /// stack (see [`StackHint`]): the same trace bytes, with less work
    /// when the hint fits.
    pub fn write_hinted(
        &mut self,
        record: &Record,
        hint: Option<&StackHint>,
    ) -> Result<(), FormatError> {
        self.retrying(|b| b.push_hinted(record, hint))
    }

    /// [`write_hinted`](Self::write_hinted) sample `s` with the stack
    /// bytes `stack` at `s.stack.start` (see [`BlockBuilder::push_sample`]):
    /// bytes held elsewhere need not be copied into the sample.
    pub fn write_sample(
        &mut self,
        s: &Sample,
        stack: &[u8],
        hint: Option<&StackHint>,
    ) -> Result<(), FormatError> {
        self.retrying(|b| b.push_sample(s, stack, hint))
    }

    /// Push with `push`, again into a new block if the record did not fit
    /// in a block that has records.
    fn retrying(
        &mut self,
        mut push: impl FnMut(&mut BlockBuilder) -> Result<(), FormatError>,
    ) -> Result<(), FormatError> {
        match push(&mut self.builder) {
            Err(FormatError::RecordTooLarge { .. }) if !self.builder.is_empty() => {
                self.flush_block()?;
                push(&mut self.builder)?;
            }
            other => other?,
        }
        self.flush_if_full()
    }

    fn flush_if_full(&mut self) -> Result<(), FormatError> {
        if self.builder.raw_len() >= self.options.block_size
            || self.builder.decoded_len() >= crate::block::BLOCK_DECODED_TARGET
        {
            self.flush_block()?;
        }
        Ok(())
    }

    /// Compress and write the buffered records as one block, if there are any.
    pub fn flush_block(&mut self) -> Result<(), FormatError> {
        if self.builder.is_empty() {
            return Ok(());
        }
        let block = self.builder.finish(self.options.zstd_level)?;
        self.write_block(&block)
    }

    /// Write a block encoded elsewhere (e.g. compressed on another thread
    /// with [`BlockBuilder::finish`]).
    pub fn write_block(&mut self, block: &EncodedBlock) -> Result<(), FormatError> {
        self.out.write_all(&block.bytes)?;
        self.out.flush()?;
        self.index.push(IndexEntry {
            offset: self.offset,
            record_count: block.header.record_count,
            first_time: block.header.first_time,
            last_time: block.header.last_time,
        });
        self.offset += block.bytes.len() as u64;
        Ok(())
    }

    /// Bytes written to `out` so far.
    pub fn bytes_written(&self) -> u64 {
        self.offset
    }

    /// Write the last block, the index and the footer; return `out`.
    pub fn finish(mut self) -> Result<W, FormatError> {
        self.flush_block()?;
        let index_offset = self.offset;
        let index = encode_index(&self.index, self.options.zstd_level)?;
        self.out.write_all(&index.bytes)?;
        self.out.write_all(&footer_bytes(index_offset))?;
        self.out.flush()?;
        Ok(self.out)
    }
}

pub(crate) fn encode_header(header: &TraceHeader) -> Result<Vec<u8>, FormatError> {
    crate::block::bincode_header_options()
        .serialize(header)
        .map_err(|e| FormatError::Encode(e.to_string()))
}
