//! The writer thread shared by every backend.
//!
//! A backend's sampling thread hands raw data (whatever is cheapest for it
//! to produce) over a bounded channel; the writer thread turns it into
//! [`Record`]s with the backend's [`Convert`], writes them with a
//! [`TraceWriter`] and keeps the counts that the status reports and the
//! summary show. The channel is bounded so memory stays bounded: when the
//! writer falls behind, the sampling side blocks and the kernel's buffers
//! overflow, which the backend reports as lost samples.

use crate::error::RecordError;
use crate::report::RecordWarning;
use lrnprof_format::{
    Pid, Record, StackHint, Summary, Tid, Timestamp, TraceHeader, TraceWriter, WriterOptions,
};
use std::collections::HashSet;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest records wait in memory before being written as a block.
const MAX_BLOCK_AGE: Duration = Duration::from_secs(1);

/// Code addresses the recorder named for a trace's frame tables.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FramesNamed {
    pub addresses: u64,
    /// Of `addresses`, those the frame cache had kept.
    pub from_cache: u64,
}

/// What [`Convert::stack_for`] gives of a record's stack.
#[derive(Debug, Default)]
pub(crate) struct StackFor<'a> {
    pub hint: Option<StackHint>,
    /// A sample's stack bytes, held by the converter: the record's own
    /// are then empty.
    pub bytes: Option<&'a [u8]>,
}

/// Turns a backend's raw data into records, on the writer thread.
pub(crate) trait Convert: Send + 'static {
    /// What the sampling thread sends.
    type Raw: Send + 'static;

    /// Convert one message; push the resulting records onto `out`.
    fn convert(&mut self, raw: Self::Raw, out: &mut Vec<Record>) -> Result<(), RecordError>;

    /// What is known of the stack of `record`, a record this converter
    /// just pushed onto `out`, asked of each in the order pushed, right
    /// before it is written: a hint that saves the trace writer comparing
    /// it with the thread's previous stack, and the sample's stack bytes
    /// if the converter holds them apart from the record.
    fn stack_for(&mut self, _record: &Record) -> StackFor<'_> {
        StackFor::default()
    }

    /// Take back the buffer of a written sample's stack (dropped by
    /// default).
    fn recycle_stack(&mut self, _bytes: Vec<u8>) {}

    /// Take back a hint [`Convert::stack_for`] gave, once the trace
    /// writer is done with it (dropped by default).
    fn recycle_hint(&mut self, _hint: StackHint) {}

    /// Called first on the writer thread (e.g. to raise its priority).
    fn on_writer_thread(&mut self) {}

    /// Code addresses named for the trace's frame tables, and how many of
    /// them the frame cache had kept (known once [`Convert::finish`] ran).
    fn frames_named(&self) -> FramesNamed {
        FramesNamed::default()
    }

    /// Sampling has stopped: push everything still held back (e.g. records
    /// waiting to be put in time order, embedded blobs), and what the user
    /// should know about it onto `warnings` (the caller reports them).
    fn finish(
        &mut self,
        out: &mut Vec<Record>,
        warnings: &mut Vec<RecordWarning>,
    ) -> Result<(), RecordError>;
}

/// A converter for backends that produce records directly (macOS).
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub(crate) struct Identity;

impl Convert for Identity {
    type Raw = Record;

    fn convert(&mut self, raw: Record, out: &mut Vec<Record>) -> Result<(), RecordError> {
        out.push(raw);
        Ok(())
    }

    fn finish(
        &mut self,
        _out: &mut Vec<Record>,
        _warnings: &mut Vec<RecordWarning>,
    ) -> Result<(), RecordError> {
        Ok(())
    }
}

/// Counts updated by the writer thread, read for the status reports.
#[derive(Debug, Default)]
pub(crate) struct LiveStats {
    /// Samples written.
    pub samples: AtomicU64,
    /// Samples reported lost.
    pub lost: AtomicU64,
    /// Distinct (pid, tid) seen.
    pub threads: AtomicU64,
    /// Image map records written.
    pub images: AtomicU64,
    /// Trace bytes written to the file so far.
    pub bytes_written: AtomicU64,
    /// Bytes of embedded blob data.
    pub blob_bytes: AtomicU64,
}

/// What the writer thread reports when it is done.
#[derive(Debug, Clone, Default)]
pub(crate) struct SinkTotals {
    /// The summary record written.
    pub summary: Summary,
    /// Size of the finished trace, in bytes.
    pub trace_bytes: u64,
    /// Bytes the embedded blobs take in the trace file (compressed).
    pub blob_file_bytes: u64,
    /// Code addresses named for the frame tables, and how many of them the
    /// frame cache had kept ([`Convert::frames_named`]).
    pub frames_named: FramesNamed,
    /// What the converter had to warn about when finishing.
    pub warnings: Vec<RecordWarning>,
    /// The process's CPU time when the recording stopped, before the
    /// converter finished the trace.
    pub cpu_while_recording: Option<std::time::Duration>,
}

/// The trace file while recording starts. Until [`keep`](Self::keep) it is
/// written under a temporary name beside its path, removed on drop: a
/// recording that fails to start leaves no file, and a file already at the
/// path (an earlier trace) stays as it was. A device or FIFO at the path
/// (`--out /dev/null`, a named pipe) is written in place and never
/// replaced or removed.
#[derive(Debug)]
pub(crate) struct OutputFile {
    path: PathBuf,
    /// The temporary name, renamed to `path` by `keep`; `None` in place.
    temp: Option<PathBuf>,
    file: Option<File>,
    keep: bool,
}

impl OutputFile {
    /// Create the trace file (under its temporary name).
    pub fn create(path: &Path) -> Result<OutputFile, RecordError> {
        let err = |source| RecordError::Output {
            path: path.to_owned(),
            source,
        };
        let existing = std::fs::metadata(path).ok();
        if existing.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "it is a directory",
            )));
        }
        if existing.is_some_and(|m| !m.is_file()) {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(err)?;
            return Ok(OutputFile {
                path: path.to_owned(),
                temp: None,
                file: Some(file),
                keep: false,
            });
        }
        let Some(name) = path.file_name() else {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it names no file",
            )));
        };
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{}.tmp", std::process::id()));
        let temp = path.with_file_name(temp_name);
        let file = File::create(&temp).map_err(err)?;
        Ok(OutputFile {
            path: path.to_owned(),
            temp: Some(temp),
            file: Some(file),
            keep: false,
        })
    }

    /// The trace path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Recording has started: the file takes its name, and stays even if
    /// something fails later (it is then readable but not marked
    /// finished).
    pub fn keep(mut self) -> Result<File, RecordError> {
        if let Some(temp) = &self.temp {
            std::fs::rename(temp, &self.path).map_err(|source| RecordError::Output {
                path: self.path.clone(),
                source,
            })?;
        }
        self.keep = true;
        Ok(self.file.take().expect("the file is taken only once"))
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if !self.keep {
            self.file = None;
            if let Some(temp) = &self.temp {
                let _ = std::fs::remove_file(temp);
            }
        }
    }
}

/// The trace file, counting the bytes written to it: a device or FIFO
/// has no length to ask for.
struct Counted {
    file: File,
    bytes: u64,
}

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

enum Msg<R> {
    Data(R),
    Finish(Timestamp),
}

/// Sends raw data to the writer thread. Cheap to clone.
pub(crate) struct SinkSender<R> {
    tx: SyncSender<Msg<R>>,
}

impl<R> Clone for SinkSender<R> {
    fn clone(&self) -> Self {
        SinkSender {
            tx: self.tx.clone(),
        }
    }
}

impl<R: Send> SinkSender<R> {
    /// Hand over data; blocks while the channel is full. Fails only if the
    /// writer thread has stopped (its error comes from [`Sink::finish`]).
    pub fn send(&self, raw: R) -> Result<(), RecordError> {
        self.tx
            .send(Msg::Data(raw))
            .map_err(|_| RecordError::Internal("the trace writer thread stopped".into()))
    }
}

/// The running writer thread.
pub(crate) struct Sink<R> {
    tx: SyncSender<Msg<R>>,
    thread: JoinHandle<Result<SinkTotals, RecordError>>,
    stats: Arc<LiveStats>,
    path: PathBuf,
}

impl<R: Send + 'static> Sink<R> {
    /// Write the trace header to `file` and start the writer thread, which
    /// buffers at most `capacity` messages.
    pub fn start<C: Convert<Raw = R>>(
        file: OutputFile,
        header: &TraceHeader,
        converter: C,
        capacity: usize,
    ) -> Result<Sink<R>, RecordError> {
        let path = file.path().to_owned();
        let out = BufWriter::with_capacity(
            1 << 20,
            Counted {
                file: file.keep()?,
                bytes: 0,
            },
        );
        let writer = TraceWriter::new(out, header, writer_options())?;
        let stats = Arc::new(LiveStats::default());
        let (tx, rx) = sync_channel(capacity);
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("lrnprof-writer".into())
            .spawn(move || run(writer, converter, rx, &thread_stats))
            .map_err(|e| RecordError::Sys {
                what: "starting the writer thread".into(),
                source: e,
            })?;
        Ok(Sink {
            tx,
            thread,
            stats,
            path,
        })
    }

    /// A sender for the sampling thread.
    pub fn sender(&self) -> SinkSender<R> {
        SinkSender {
            tx: self.tx.clone(),
        }
    }

    /// Counts for the status reports.
    pub fn stats(&self) -> Arc<LiveStats> {
        Arc::clone(&self.stats)
    }

    /// Stop: convert what is left, write the summary (ending at `end_time`)
    /// and the trace footer, and wait for the writer thread.
    pub fn finish(self, end_time: Timestamp) -> Result<SinkTotals, RecordError> {
        // If the thread already failed, the send fails and join says why.
        let _ = self.tx.send(Msg::Finish(end_time));
        drop(self.tx);
        let result = self
            .thread
            .join()
            .map_err(|_| RecordError::Internal("the trace writer thread panicked".into()))?;
        result.map_err(|e| match e {
            RecordError::Format(lrnprof_format::FormatError::Io(source)) => RecordError::Output {
                path: self.path,
                source,
            },
            other => other,
        })
    }
}

fn writer_options() -> WriterOptions {
    // Blocks of 1 MiB raw records compress well and lose little if the
    // recorder is killed. zstd's level 2 compressed the raw blocks of
    // python, system-wide and deep-stack traces 8-25 % faster than level 3
    // (the format's default) to within 4 % of its size, smaller on some;
    // see docs/benchmarks.md.
    WriterOptions {
        block_size: 1 << 20,
        zstd_level: 2,
    }
}

/// Counts what goes into the trace.
#[derive(Default)]
struct Counter {
    threads: HashSet<(Pid, Tid)>,
    summary: Summary,
    blob_bytes: u64,
}

impl Counter {
    fn count(&mut self, record: &Record) {
        match record {
            Record::Sample(s) => {
                self.summary.samples += 1;
                self.threads.insert((s.pid, s.tid));
            }
            Record::Thread(t) => {
                self.threads.insert((t.pid, t.tid));
            }
            Record::ImageMap(_) => self.summary.images += 1,
            Record::Lost(l) => self.summary.lost += l.count,
            Record::Blob(b) => self.blob_bytes += b.data.len() as u64,
            _ => {}
        }
        self.summary.threads = self.threads.len() as u64;
    }

    fn publish(&self, stats: &LiveStats, bytes_written: u64) {
        stats.samples.store(self.summary.samples, Ordering::Relaxed);
        stats.lost.store(self.summary.lost, Ordering::Relaxed);
        stats.threads.store(self.summary.threads, Ordering::Relaxed);
        stats.images.store(self.summary.images, Ordering::Relaxed);
        stats.blob_bytes.store(self.blob_bytes, Ordering::Relaxed);
        stats.bytes_written.store(bytes_written, Ordering::Relaxed);
    }
}

/// Count and write `r` with what the converter knows of its stack, and
/// give the converter back what the writer no longer needs.
fn write_record<C: Convert>(
    writer: &mut TraceWriter<BufWriter<Counted>>,
    converter: &mut C,
    counter: &mut Counter,
    r: Record,
) -> Result<(), RecordError> {
    counter.count(&r);
    let StackFor { hint, bytes } = converter.stack_for(&r);
    match (&r, bytes) {
        (Record::Sample(s), Some(bytes)) => writer.write_sample(s, bytes, hint.as_ref())?,
        _ => writer.write_hinted(&r, hint.as_ref())?,
    }
    if let Some(hint) = hint {
        converter.recycle_hint(hint);
    }
    // The buffer of a stack copied whole, for a later one.
    if let Record::Sample(s) = r {
        if s.stack.bytes.capacity() > 0 {
            converter.recycle_stack(s.stack.bytes);
        }
    }
    Ok(())
}

fn run<C: Convert>(
    mut writer: TraceWriter<BufWriter<Counted>>,
    mut converter: C,
    rx: Receiver<Msg<C::Raw>>,
    stats: &LiveStats,
) -> Result<SinkTotals, RecordError> {
    converter.on_writer_thread();
    let mut counter = Counter::default();
    let mut records = Vec::new();
    let mut end_time = None;
    let mut last_flush = Instant::now();
    for msg in rx.iter() {
        match msg {
            Msg::Data(raw) => converter.convert(raw, &mut records)?,
            Msg::Finish(t) => {
                end_time = Some(t);
                break;
            }
        }
        for r in records.drain(..) {
            write_record(&mut writer, &mut converter, &mut counter, r)?;
        }
        // A recorder killed with SIGKILL keeps what is in whole blocks:
        // write one at least every second, however few records it holds.
        if last_flush.elapsed() >= MAX_BLOCK_AGE {
            writer.flush_block()?;
            last_flush = Instant::now();
        }
        counter.publish(stats, writer.bytes_written());
    }
    // Without a Finish message the sampling side died: write no summary and
    // no footer, so the trace reads as not finished cleanly.
    let end_time = end_time.ok_or_else(|| {
        RecordError::Internal("recording stopped without finishing the trace".into())
    })?;
    let cpu_while_recording = crate::summary::own_cpu();
    let mut warnings = Vec::new();
    converter.finish(&mut records, &mut warnings)?;
    // Blobs go in blocks of their own, so their size in the file is known.
    let mut blobs_start = None;
    for r in records.drain(..) {
        if matches!(r, Record::Blob(_)) && blobs_start.is_none() {
            writer.flush_block()?;
            blobs_start = Some(writer.bytes_written());
        }
        write_record(&mut writer, &mut converter, &mut counter, r)?;
    }
    writer.flush_block()?;
    let blob_file_bytes = blobs_start.map_or(0, |s| writer.bytes_written() - s);
    counter.summary.end_time = end_time;
    let summary = counter.summary.clone();
    writer.write(&Record::Summary(summary.clone()))?;
    let trace_bytes = {
        writer.flush_block()?;
        let out = writer.finish()?;
        out.into_inner()
            .map_err(|e| RecordError::Format(e.into_error().into()))?
            .bytes
    };
    counter.publish(stats, trace_bytes);
    Ok(SinkTotals {
        summary,
        trace_bytes,
        blob_file_bytes,
        frames_named: converter.frames_named(),
        warnings,
        cpu_while_recording,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lrnprof_format::{
        Blob, BlobKind, BuildId, ImageKind, ImageMapRecord, LostRecord, ThreadEvent, ThreadRecord,
        TraceReader,
    };

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("lrnprof-sink-{}-{name}", std::process::id()))
    }

    #[test]
    fn an_output_file_not_kept_is_removed() {
        let path = temp_path("dropped.lpt");
        drop(OutputFile::create(&path).unwrap());
        assert!(!path.exists());
        let bad = temp_path("no-such-dir/x.lpt");
        assert!(matches!(
            OutputFile::create(&bad),
            Err(RecordError::Output { .. })
        ));
        let dir = std::env::temp_dir();
        let Err(e) = OutputFile::create(&dir) else {
            panic!("a directory taken as the trace")
        };
        assert!(e.to_string().contains("it is a directory"), "{e}");
    }

    #[test]
    fn an_earlier_file_stays_until_recording_starts() {
        let path = temp_path("earlier.lpt");
        std::fs::write(&path, b"earlier trace").unwrap();
        // A start that fails: the earlier file is untouched, and the
        // temporary one gone.
        drop(OutputFile::create(&path).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"earlier trace");
        let dir = path.parent().unwrap();
        let temp_prefix = format!(".{}.", path.file_name().unwrap().to_string_lossy());
        let leftovers = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&temp_prefix))
            .count();
        assert_eq!(leftovers, 0);
        // A start that succeeds replaces it.
        let mut file = OutputFile::create(&path).unwrap().keep().unwrap();
        std::io::Write::write_all(&mut file, b"new").unwrap();
        drop(file);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        std::fs::remove_file(&path).unwrap();
    }

    /// What `--out /dev/null` or a named pipe is: not a regular file. A
    /// FIFO of the test's own stands for both (a regression must not
    /// remove the machine's /dev/null).
    #[test]
    #[cfg(unix)]
    fn a_fifo_or_device_is_written_in_place_and_never_removed() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let fifo = temp_path("fifo.lpt");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // Safety: mkfifo takes a NUL-terminated path and a mode.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // A reader, so that opening the FIFO for writing does not wait.
        let mut reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        drop(OutputFile::create(&fifo).unwrap());
        let is_fifo = |p: &Path| {
            use std::os::unix::fs::FileTypeExt;
            std::fs::metadata(p).is_ok_and(|m| m.file_type().is_fifo())
        };
        assert!(is_fifo(&fifo), "a failed start removed the FIFO");
        let mut file = OutputFile::create(&fifo).unwrap().keep().unwrap();
        std::io::Write::write_all(&mut file, b"trace").unwrap();
        drop(file);
        assert!(is_fifo(&fifo), "the FIFO was replaced");
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut got).unwrap();
        assert_eq!(got, b"trace");
        std::fs::remove_file(&fifo).unwrap();
    }

    fn thread(tid: u32) -> Record {
        Record::Thread(ThreadRecord {
            time: Timestamp(u64::from(tid)),
            pid: Pid(1),
            tid: Tid(tid),
            event: ThreadEvent::Start,
            name: None,
        })
    }

    #[test]
    fn the_writer_counts_and_finishes_the_trace() {
        let path = temp_path("finished.lpt");
        let sink = Sink::start(
            OutputFile::create(&path).unwrap(),
            &TraceHeader::example(),
            Identity,
            4,
        )
        .unwrap();
        let tx = sink.sender();
        tx.send(thread(1)).unwrap();
        tx.send(thread(2)).unwrap();
        tx.send(thread(2)).unwrap();
        tx.send(Record::ImageMap(ImageMapRecord {
            time: Timestamp(3),
            pid: Pid(1),
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            path: "/bin/x".into(),
            build_id: None,
            kind: ImageKind::File,
            executable: true,
        }))
        .unwrap();
        tx.send(Record::Lost(LostRecord {
            time: Timestamp(4),
            pid: None,
            tid: None,
            count: 5,
            source: lrnprof_format::LostSource::Kernel,
        }))
        .unwrap();
        tx.send(Record::Blob(Blob {
            build_id: BuildId(vec![1]),
            kind: BlobKind::Image,
            compressed: false,
            offset: 0,
            total_len: 4,
            data: vec![1, 2, 3, 4],
        }))
        .unwrap();
        let totals = sink.finish(Timestamp(10)).unwrap();
        assert_eq!(totals.summary.threads, 2);
        assert_eq!(totals.summary.images, 1);
        assert_eq!(totals.summary.lost, 5);
        assert_eq!(totals.summary.end_time, Timestamp(10));
        assert_eq!(totals.trace_bytes, std::fs::metadata(&path).unwrap().len());
        let reader = TraceReader::open(&path).unwrap();
        assert!(reader.report().finished);
        let records: Vec<Record> = reader.records().map(Result::unwrap).collect();
        assert_eq!(records.len(), 7);
        assert_eq!(records.last(), Some(&Record::Summary(totals.summary)));
        let _ = std::fs::remove_file(&path);
    }

    /// Blobs pushed by the converter at the end go in blocks of their own,
    /// so the summary can say what embedding added.
    struct WithBlob;

    impl Convert for WithBlob {
        type Raw = Record;

        fn convert(&mut self, raw: Record, out: &mut Vec<Record>) -> Result<(), RecordError> {
            out.push(raw);
            Ok(())
        }

        fn finish(
            &mut self,
            out: &mut Vec<Record>,
            warnings: &mut Vec<RecordWarning>,
        ) -> Result<(), RecordError> {
            warnings.push(RecordWarning::MalformedRecords { count: 1 });
            out.push(Record::Blob(Blob {
                build_id: BuildId(vec![2]),
                kind: BlobKind::Image,
                compressed: false,
                offset: 0,
                total_len: 3000,
                data: (0..3000u32).map(|i| (i * 7919 % 251) as u8).collect(),
            }));
            Ok(())
        }
    }

    #[test]
    fn embedded_bytes_are_measured_in_the_file() {
        let path = temp_path("blobs.lpt");
        let sink = Sink::start(
            OutputFile::create(&path).unwrap(),
            &TraceHeader::example(),
            WithBlob,
            4,
        )
        .unwrap();
        sink.sender().send(thread(1)).unwrap();
        let totals = sink.finish(Timestamp(10)).unwrap();
        assert!(totals.blob_file_bytes > 0);
        assert!(totals.blob_file_bytes < totals.trace_bytes);
        assert_eq!(
            totals.warnings,
            vec![RecordWarning::MalformedRecords { count: 1 }]
        );
        let _ = std::fs::remove_file(&path);
    }
}
