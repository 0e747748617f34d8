//! A store's group commits, run outside Python: a thread of its own takes the shift records handed
//! to it, commits whatever queued as one transaction, and reports each record's outcome to the
//! event loop through a socket the loop watches. Neither the thread nor the transaction ever takes
//! the GIL, so the event loop (which makes the records) and the commits run side by side on two
//! cores, where a Python writer thread traded the GIL with the loop at every statement and every
//! wake-up (`docs/benchmarks.md`, "Audited path").
//!
//! A store writes the common group only, and decides nothing the store's own path
//! (`audit/sql.py`) would decide differently: each record's generation, and with a chat its audit
//! (checked against the audit it was made on) and the chat's segments. A group is `Declined`,
//! nothing of it written, when the store's own path must write it: a check failed (the chat's audit
//! changed, a generation id another chat uses: the store's path says which record, and why), or
//! something only the store's path handles (room to claim, an error it retries or reports record by
//! record). The statements are the store's own, handed over as text: the core owns no SQL.
//! `sqlite_group` and `postgres_group` are the two stores.
//!
//! A store that makes the event loop wait for its reads (PostgreSQL) also reads a chat's audit
//! here: the reads queued with a group are answered before it, each by its token.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Records one transaction takes at most (as the store's Python writer).
pub const MAX_GROUP: usize = 256;
/// The thread's name (at most 15 bytes: Linux keeps no more of it, and tools read it there).
pub const THREAD_NAME: &str = "cs-core-writer";

/// A statement's parameter, as Python's sqlite3 binds it (a bool as an integer); each store binds
/// it as its columns need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Null,
    Integer(i64),
    Text(String),
    Blob(Vec<u8>),
}

/// The store's statements, each with `?` parameters (`$1`, `$2`... for PostgreSQL) in the order
/// given below.
pub struct Statements {
    /// A chat's audit (tenant, chat id): its tenant, chat id, generation id and creation time.
    pub current_audit: String,
    /// A generation (its parameters as the record gives them); changes no row when another chat
    /// uses the generation id.
    pub generation: String,
    /// A chat's audit, replacing its last one (its parameters as the record gives them).
    pub audit: String,
    /// A segment of a chat's blocks (tenant, chat id, hash, data), unless stored already.
    pub segment: String,
    /// A segment of a chat's blocks no longer needed (tenant, chat id, hash).
    pub delete_segment: String,
}

/// A chat's audit and what it writes besides.
pub struct AuditWrite {
    pub tenant: String,
    pub chat_id: String,
    /// The chat's lock (what the store's path locks while writing it; PostgreSQL's advisory lock).
    pub lock_key: String,
    /// The chat's audit the shift was made against (generation id, creation ms); None: none.
    pub made_on: Option<(String, i64)>,
    /// The new audit's (generation id, creation ms), current once it is written.
    pub key: (String, i64),
    pub row: Vec<Value>,
    /// (hash, data) of each segment to add.
    pub new_segments: Vec<(Vec<u8>, Vec<u8>)>,
    /// Hashes of the segments to delete.
    pub gone_segments: Vec<Vec<u8>>,
}

/// One shift's record: its generation and, with a chat, its audit; and the room it claims (the
/// bytes the store's path would claim for it).
pub struct Record {
    pub generation: Vec<Value>,
    pub audit: Option<AuditWrite>,
    pub claim: i64,
}

/// What the thread is handed: a record to write, or the parameters of a read of a chat's audit.
#[allow(clippy::large_enum_variant)] // nearly every job is a write: boxing it would allocate again
pub enum Job {
    Write(Record),
    Read(Vec<Value>),
}

/// A read's row (None: no row).
pub type Row = Option<Vec<Value>>;

/// What a group's write came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// Every record is committed.
    Stored,
    /// Nothing is (see the module's doc).
    Declined,
}

/// The records of a group checked in turn against their chats' audits: each chat's current audit
/// read once (by `read`, when first met), then the one the group's earlier record of it writes.
/// False when a record was made against an audit its chat no longer has.
pub fn made_on_current<E>(
    records: &[Record],
    mut read: impl FnMut(&AuditWrite) -> Result<Option<(String, i64)>, E>,
) -> Result<bool, E> {
    let mut current: std::collections::HashMap<(&str, &str), Option<(String, i64)>> = Default::default();
    for audit in records.iter().filter_map(|r| r.audit.as_ref()) {
        let chat = (audit.tenant.as_str(), audit.chat_id.as_str());
        let now = match current.get(&chat) {
            Some(now) => now.clone(),
            None => read(audit)?,
        };
        if now != audit.made_on {
            return Ok(false);
        }
        current.insert(chat, Some(audit.key.clone()));
    }
    Ok(true)
}

/// A connection that writes groups of records.
pub trait GroupStore: Send + 'static {
    /// Why a group was not written.
    type Failure: Clone + Send + 'static;

    /// Commits `records` in one transaction, or declines them; an error rolls all of them back.
    fn write(&mut self, records: &[Record]) -> Result<Written, Self::Failure>;

    /// Each read's row, or None when they are declined (the store's own path reads them).
    fn read(&mut self, reads: &[Vec<Value>]) -> Result<Option<Vec<Row>>, Self::Failure> {
        let _ = reads;
        Ok(None) // a store whose reads need not wait reads them itself
    }

    /// The failure of a group whose write panicked.
    fn panicked() -> Self::Failure;

    /// What the process's log should say of this connection since the last call (its connection
    /// refused, then made again): taken after each group.
    fn notices(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// A record's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<F> {
    Stored,
    /// Its group was declined: the store's own path must write it.
    Declined,
    Failed(F),
    /// A read's row.
    Read(Row),
}

/// What the thread has finished since the last look: each record's outcome by its token, each
/// group's size and how long its write took, and the store's notices (`GroupStore::notices`).
pub struct Finished<F> {
    pub records: Vec<(u64, Outcome<F>)>,
    pub groups: Vec<(usize, Duration)>,
    pub notices: Vec<String>,
}

impl<F> Default for Finished<F> {
    fn default() -> Self {
        Finished { records: Vec::new(), groups: Vec::new(), notices: Vec::new() }
    }
}

/// A `GroupStore` on a thread of its own (see the module's doc).
pub struct WriterThread<S: GroupStore> {
    queue: Option<Sender<(u64, Job)>>,
    finished: Arc<Mutex<Finished<S::Failure>>>,
    // Read by the event loop; a byte is written to the other end when `finished` stops being empty.
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
    // The process that started the thread: a forked child has a copy of this value but not the
    // thread, and must neither join it nor close its connection.
    pid: u32,
}

impl<S: GroupStore> WriterThread<S> {
    pub fn start(store: S) -> io::Result<Self> {
        let (wake, waker) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        waker.set_nonblocking(true)?;
        let (queue, queued) = mpsc::channel();
        let finished = Arc::new(Mutex::new(Finished::default()));
        let shared = Arc::clone(&finished);
        let thread =
            std::thread::Builder::new().name(THREAD_NAME.into()).spawn(move || run(store, &queued, &shared, waker))?;
        Ok(WriterThread { queue: Some(queue), finished, wake, thread: Some(thread), pid: std::process::id() })
    }

    /// The socket that becomes readable when records are finished.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Queues a job under `token`; false when the thread has stopped (nothing queued).
    pub fn submit(&self, token: u64, job: Job) -> bool {
        self.queue.as_ref().is_some_and(|queue| queue.send((token, job)).is_ok())
    }

    /// What is finished (see `Finished`), and the wake-up socket read empty.
    pub fn finished(&self) -> Finished<S::Failure> {
        let mut buffer = [0u8; 64];
        while matches!((&self.wake).read(&mut buffer), Ok(n) if n > 0) {}
        std::mem::take(&mut *lock(&self.finished))
    }

    /// Writes what is queued, then stops the thread. In a forked child, only forgets it.
    pub fn stop(&mut self) {
        self.queue = None;
        let Some(thread) = self.thread.take() else { return };
        if std::process::id() == self.pid {
            let _ = thread.join(); // a panic is caught per group: the thread itself never panics
        } else {
            std::mem::forget(thread);
        }
    }
}

impl<S: GroupStore> Drop for WriterThread<S> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<F>(finished: &Mutex<Finished<F>>) -> MutexGuard<'_, Finished<F>> {
    finished.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn run<S: GroupStore>(
    mut store: S,
    queued: &Receiver<(u64, Job)>,
    finished: &Mutex<Finished<S::Failure>>,
    mut waker: UnixStream,
) {
    while let Ok(first) = queued.recv() {
        let (mut writes, mut reads) = (Vec::new(), Vec::new());
        let mut take = |(token, job): (u64, Job)| match job {
            Job::Write(record) => writes.push((token, record)),
            Job::Read(params) => reads.push((token, params)),
        };
        take(first);
        for _ in 1..MAX_GROUP {
            let Ok(job) = queued.try_recv() else { break };
            take(job);
        }
        let mut done = Vec::with_capacity(writes.len() + reads.len());
        if !reads.is_empty() {
            let (tokens, params): (Vec<u64>, Vec<Vec<Value>>) = reads.into_iter().unzip();
            match catch_unwind(AssertUnwindSafe(|| store.read(&params))) {
                Ok(Ok(Some(rows))) => done.extend(tokens.into_iter().zip(rows.into_iter().map(Outcome::Read))),
                Ok(Ok(None)) => done.extend(tokens.into_iter().map(|token| (token, Outcome::Declined))),
                Ok(Err(e)) => done.extend(tokens.into_iter().map(|token| (token, Outcome::Failed(e.clone())))),
                Err(_) => done.extend(tokens.into_iter().map(|token| (token, Outcome::Failed(S::panicked())))),
            }
        }
        let mut group = None;
        if !writes.is_empty() {
            let (tokens, records): (Vec<u64>, Vec<Record>) = writes.into_iter().unzip();
            let started = Instant::now();
            let outcome = match catch_unwind(AssertUnwindSafe(|| store.write(&records))) {
                Ok(Ok(Written::Stored)) => Outcome::Stored,
                Ok(Ok(Written::Declined)) => Outcome::Declined,
                Ok(Err(e)) => Outcome::Failed(e),
                Err(_) => Outcome::Failed(S::panicked()),
            };
            done.extend(tokens.into_iter().map(|token| (token, outcome.clone())));
            group = Some((records.len(), started.elapsed()));
        }
        let notices = store.notices();
        let mut finished = lock(finished);
        let was_empty = finished.records.is_empty() && finished.notices.is_empty();
        finished.records.extend(done);
        finished.groups.extend(group);
        finished.notices.extend(notices);
        drop(finished);
        if was_empty {
            // Full only when the loop has not read the bytes of earlier wake-ups: woken already.
            let _ = waker.write(&[1]);
        }
    }
}
