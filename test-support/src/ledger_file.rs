//! A ledger that several OS processes write: one append-only file, one line per event, each
//! line written by one `write` on a file opened with `O_APPEND`, so that the lines of different
//! processes never interleave (the kernel appends each write whole at the file's end). No fsync:
//! the readers are on the same machine, and a process killed with `SIGKILL` has already handed
//! every line it wrote to the kernel.
//!
//! A line is `<unix-ns> <replica> <pid> <kind> <subject> [<detail>]`, separated by single
//! spaces, the time the machine's wall clock (`CLOCK_REALTIME`) when the event was recorded:
//! one clock for every process on the machine. `replica`, `kind` and `subject` hold no
//! whitespace; `detail` is the rest of the line.
//!
//! A test reads the file as it grows ([`Tail`]) and feeds it into a [`Ledger`] ([`Feed`]): a
//! `start` line of a subject begins a run, the next `end` line of the same subject from the same
//! process ends it; every other kind is kept for the test to read.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::ledger::Ledger;

/// The kind of a line that begins a run.
pub const START: &str = "start";
/// The kind of a line that ends the run its process began last for the same subject.
pub const END: &str = "end";

/// The machine's wall clock now, in nanoseconds since the Unix epoch.
pub fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// One process's writer of the ledger file.
#[derive(Debug)]
pub struct LedgerWriter {
    file: File,
    replica: String,
    pid: u32,
}

impl LedgerWriter {
    /// Opens (or creates) the ledger at `path` for appending, as `replica` (no whitespace).
    pub fn open(path: impl AsRef<Path>, replica: &str) -> io::Result<Self> {
        if replica.is_empty() || replica.contains(char::is_whitespace) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a replica's name must be one word, not {replica:?}"),
            ));
        }
        // `append`: O_APPEND, each write goes to the end of the file as it is then.
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LedgerWriter {
            file,
            replica: replica.into(),
            pid: std::process::id(),
        })
    }

    /// Appends one line, stamped now. Whitespace in `kind` and `subject` becomes `_`; line
    /// breaks in `detail` become spaces.
    pub fn record(&self, kind: &str, subject: &str, detail: &str) -> io::Result<()> {
        let word = |s: &str| s.replace(char::is_whitespace, "_");
        let mut line = format!(
            "{} {} {} {} {}",
            wall_ns(),
            self.replica,
            self.pid,
            word(kind),
            word(subject)
        );
        if !detail.is_empty() {
            line.push(' ');
            line.push_str(&detail.replace(['\n', '\r'], " "));
        }
        line.push('\n');
        // One write: `&File` writes without a buffer, and a regular file takes the whole line.
        (&self.file).write_all(line.as_bytes())
    }

    /// Records the start of a run of `subject`.
    pub fn start(&self, subject: &str) -> io::Result<()> {
        self.record(START, subject, "")
    }

    /// Records the end of this process's run of `subject`.
    pub fn end(&self, subject: &str) -> io::Result<()> {
        self.record(END, subject, "")
    }
}

/// One line of the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// When it was recorded: nanoseconds since the Unix epoch, on the machine's wall clock.
    pub at_ns: u128,
    /// Who recorded it.
    pub replica: String,
    /// The process that recorded it.
    pub pid: u32,
    /// What happened: [`START`], [`END`], or a kind the writer chose.
    pub kind: String,
    /// Of what (an object's `namespace/name`, say).
    pub subject: String,
    /// The rest of the line (may be empty).
    pub detail: String,
}

impl Line {
    /// Parses a line (without its line break).
    pub fn parse(text: &str) -> Result<Line, String> {
        let mut parts = text.splitn(6, ' ');
        let mut next = |what: &str| {
            parts
                .next()
                .filter(|p| !p.is_empty())
                .ok_or_else(|| format!("ledger line {text:?} has no {what}"))
        };
        let at_ns = next("time")?;
        let at_ns = at_ns
            .parse()
            .map_err(|e| format!("ledger line {text:?}: bad time: {e}"))?;
        let replica = next("replica")?.to_string();
        let pid = next("pid")?;
        let pid = pid
            .parse()
            .map_err(|e| format!("ledger line {text:?}: bad pid: {e}"))?;
        let kind = next("kind")?.to_string();
        let subject = next("subject")?.to_string();
        let detail = parts.next().unwrap_or_default().to_string();
        Ok(Line {
            at_ns,
            replica,
            pid,
            kind,
            subject,
            detail,
        })
    }
}

/// Reads a ledger file as it grows: each call returns the complete lines written since the last.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    offset: u64,
    /// The start of a line whose end was not written yet.
    partial: String,
}

impl Tail {
    /// A reader of `path` from its beginning (the file may not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Tail {
            path: path.into(),
            offset: 0,
            partial: String::new(),
        }
    }

    /// The complete lines written since the last call. Panics on a line it cannot parse: every
    /// writer is ours, so one is a defect.
    pub fn read_new(&mut self) -> io::Result<Vec<Line>> {
        let mut file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        self.offset += bytes.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&bytes));
        let Some(last_break) = self.partial.rfind('\n') else {
            return Ok(Vec::new());
        };
        let rest = self.partial.split_off(last_break + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        Ok(complete
            .lines()
            .map(|l| Line::parse(l).unwrap_or_else(|e| panic!("{e}")))
            .collect())
    }
}

/// Wall-clock times as tokio instants: a pair read together, and the distance from it.
#[derive(Clone, Copy, Debug)]
pub struct WallAnchor {
    wall_ns: u128,
    instant: Instant,
}

impl WallAnchor {
    /// The anchor now.
    pub fn now() -> Self {
        WallAnchor {
            wall_ns: wall_ns(),
            instant: Instant::now(),
        }
    }

    /// The tokio instant of the wall-clock time `at_ns` (assumes the wall clock was not set in
    /// between; it only slews).
    pub fn instant(&self, at_ns: u128) -> Instant {
        let nanos = |d: u128| Duration::from_nanos(u64::try_from(d).unwrap_or(u64::MAX));
        if at_ns >= self.wall_ns {
            self.instant + nanos(at_ns - self.wall_ns)
        } else {
            let back = nanos(self.wall_ns - at_ns);
            self.instant.checked_sub(back).unwrap_or(self.instant)
        }
    }

    /// The wall-clock time of the tokio instant `at`, in ns since the Unix epoch.
    pub fn wall_of(&self, at: Instant) -> u128 {
        if at >= self.instant {
            self.wall_ns + (at - self.instant).as_nanos()
        } else {
            self.wall_ns - (self.instant - at).as_nanos()
        }
    }
}

/// Feeds ledger lines into a [`Ledger`] of subjects (`String`s): one ledger process per OS
/// process (by pid), runs from `start` to `end` lines, every line kept in order.
#[derive(Debug)]
pub struct Feed {
    ledger: Ledger<String>,
    anchor: WallAnchor,
    /// The ledger's process number of each pid.
    processes: HashMap<u32, usize>,
    /// Open runs (ledger indexes) by pid and subject, oldest first.
    open: HashMap<(u32, String), Vec<usize>>,
    lines: Vec<Line>,
}

impl Feed {
    /// A feed into `ledger`, converting wall-clock times through `anchor`.
    pub fn new(ledger: Ledger<String>, anchor: WallAnchor) -> Self {
        Feed {
            ledger,
            anchor,
            processes: HashMap::new(),
            open: HashMap::new(),
            lines: Vec::new(),
        }
    }

    /// The ledger it feeds.
    pub fn ledger(&self) -> &Ledger<String> {
        &self.ledger
    }

    /// The anchor it converts times with.
    pub fn anchor(&self) -> WallAnchor {
        self.anchor
    }

    /// The ledger's process number of `pid` (made on first sight).
    pub fn process(&mut self, pid: u32) -> usize {
        *self
            .processes
            .entry(pid)
            .or_insert_with(|| self.ledger.process())
    }

    /// Takes in `lines`, in the order they were written.
    pub fn push(&mut self, lines: impl IntoIterator<Item = Line>) {
        for line in lines {
            let at = self.anchor.instant(line.at_ns);
            let process = self.process(line.pid);
            let key = (line.pid, line.subject.clone());
            match line.kind.as_str() {
                START => {
                    let run =
                        self.ledger
                            .begin_at(&line.replica, process, line.subject.clone(), at);
                    self.open.entry(key).or_default().push(run);
                }
                END => {
                    let run = self
                        .open
                        .get_mut(&key)
                        .and_then(|runs| (!runs.is_empty()).then(|| runs.remove(0)));
                    let run =
                        run.unwrap_or_else(|| panic!("ledger: an end without a start: {line:?}"));
                    self.ledger.end_at(run, at);
                }
                _ => {}
            }
            self.lines.push(line);
        }
    }

    /// Every line so far.
    pub fn lines(&self) -> &[Line] {
        &self.lines
    }

    /// The tokio instant of a line.
    pub fn at(&self, line: &Line) -> Instant {
        self.anchor.instant(line.at_ns)
    }

    /// The process `pid` stopped running at `at` (killed, or frozen): its runs open then end
    /// there (an `end` line it writes for them later changes nothing: the first end stands).
    /// Read every line written before `at` first: runs fed later are not touched.
    pub fn stopped(&mut self, pid: u32, at: Instant) {
        let process = self.process(pid);
        self.ledger.died(process, at);
    }
}

/// A ledger file read into a [`Ledger`] on demand: [`Tail`] and [`Feed`] together.
#[derive(Debug)]
pub struct LedgerReader {
    tail: Tail,
    feed: Feed,
}

impl LedgerReader {
    /// A reader of the ledger file at `path` into a new [`Ledger`] (inside a tokio runtime: the
    /// ledger's sampler is a task).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LedgerReader {
            tail: Tail::new(path),
            feed: Feed::new(Ledger::new(), WallAnchor::now()),
        }
    }

    /// Reads the lines written since the last call into the ledger; returns the feed.
    pub fn sync(&mut self) -> &mut Feed {
        let lines = self.tail.read_new().expect("reading the ledger file");
        self.feed.push(lines);
        &mut self.feed
    }

    /// The feed as of the last [`LedgerReader::sync`].
    pub fn feed(&self) -> &Feed {
        &self.feed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ledger-file-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    #[test]
    fn lines_round_trip_and_partial_lines_wait() {
        let path = temp_path("round-trip");
        let mut tail = Tail::new(&path);
        assert!(tail.read_new().unwrap().is_empty(), "no file yet");
        let writer = LedgerWriter::open(&path, "r1").unwrap();
        writer.start("ns/cm-1").unwrap();
        writer.record("write", "ns/cm-1", "409 a\nb").unwrap();
        // Half a line from another writer: not returned until it is complete.
        let mut raw = OpenOptions::new().append(true).open(&path).unwrap();
        raw.write_all(b"12 r2 7 start ns/cm").unwrap();
        let lines = tail.read_new().unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            (lines[0].replica.as_str(), lines[0].kind.as_str()),
            ("r1", START)
        );
        assert_eq!(lines[0].pid, std::process::id());
        assert_eq!(lines[1].detail, "409 a b");
        raw.write_all(b"-2\n").unwrap();
        let lines = tail.read_new().unwrap();
        assert_eq!(
            lines,
            vec![Line {
                at_ns: 12,
                replica: "r2".into(),
                pid: 7,
                kind: START.into(),
                subject: "ns/cm-2".into(),
                detail: String::new(),
            }]
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn bad_names_and_lines_are_refused() {
        assert!(LedgerWriter::open(temp_path("bad"), "r 1").is_err());
        assert!(Line::parse("12 r1 7 start").is_err());
        assert!(Line::parse("x r1 7 start a").is_err());
        assert!(Line::parse("12 r1 seven start a").is_err());
    }

    /// Lines from many processes' writers (threads here, each with its own file description)
    /// never interleave.
    #[test]
    fn concurrent_writers_write_whole_lines() {
        let path = temp_path("concurrent");
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let writer = LedgerWriter::open(&path, &format!("r{t}")).unwrap();
                    let detail = "x".repeat(200);
                    for i in 0..500 {
                        writer.record("k", &format!("s{i}"), &detail).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let lines = Tail::new(&path).read_new().unwrap();
        assert_eq!(lines.len(), 2000);
        assert!(lines.iter().all(|l| l.detail.len() == 200));
        std::fs::remove_file(&path).unwrap();
    }

    #[tokio::test]
    async fn a_feed_builds_runs_and_a_stop_ends_them() {
        let anchor = WallAnchor::now();
        let mut feed = Feed::new(Ledger::new(), anchor);
        let t0 = anchor.wall_of(Instant::now());
        let ms = |n: u128| t0 + n * 1_000_000;
        let line = |at, replica: &str, pid, kind: &str, subject: &str| Line {
            at_ns: at,
            replica: replica.into(),
            pid,
            kind: kind.into(),
            subject: subject.into(),
            detail: String::new(),
        };
        feed.push([
            line(ms(0), "r1", 1, START, "a"),
            line(ms(10), "r1", 1, END, "a"),
            line(ms(20), "r1", 1, START, "a"),
            line(ms(25), "r1", 1, "log", "-"),
        ]);
        // r1 froze at 30 ms with "a" running; r2 took it at 40 ms.
        feed.stopped(1, anchor.instant(ms(30)));
        feed.push([
            line(ms(40), "r2", 2, START, "a"),
            line(ms(50), "r2", 2, END, "a"),
            // r1 thawed: its frozen run's end changes nothing.
            line(ms(60), "r1", 1, END, "a"),
        ]);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (runs, gap) = feed.ledger().assert_never_two_at_once();
        assert_eq!(runs, 3);
        assert_eq!(gap, Some(Duration::from_millis(10)));
        assert_eq!(feed.lines().len(), 7);
        let first = feed.ledger().runs()[0].clone();
        assert_eq!(
            first.end().unwrap() - first.start,
            Duration::from_millis(10)
        );
    }

    #[tokio::test]
    async fn overlapping_runs_of_two_processes_fail_the_check() {
        let anchor = WallAnchor::now();
        let mut feed = Feed::new(Ledger::new(), anchor);
        let t0 = anchor.wall_of(Instant::now());
        let mk = |at: u128, pid, kind: &str| Line {
            at_ns: t0 + at * 1_000_000,
            replica: format!("r{pid}"),
            pid,
            kind: kind.into(),
            subject: "a".into(),
            detail: String::new(),
        };
        feed.push([
            mk(0, 1, START),
            mk(5, 2, START),
            mk(10, 1, END),
            mk(15, 2, END),
        ]);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let ledger = feed.ledger().clone();
        let caught = std::panic::catch_unwind(move || ledger.assert_never_two_at_once());
        assert!(caught.is_err());
    }
}
