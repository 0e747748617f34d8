//! The SQLite store's group commits, run outside Python: a thread of its own takes the shift
//! records handed to it, commits whatever queued as one transaction, and reports each record's
//! outcome to the event loop through a socket the loop watches. Neither the thread nor the
//! transaction ever takes the GIL, so the event loop (which makes the records) and the commits run
//! side by side on two cores, where a Python writer thread traded the GIL with the loop at every
//! statement and every wake-up (`docs/benchmarks.md`, "Audited path").
//!
//! It writes the common group only, and decides nothing the store's own path (`audit/sql.py`)
//! would decide differently: each record's generation, and with a chat its audit (checked against
//! the audit it was made on) and the chat's segments. A group is `Declined`, nothing of it written,
//! when the disk does not plainly have room for it (the store's path then claims room record by
//! record) or a check fails (the chat's audit changed, a generation id another chat uses: the
//! store's path says which record, and why). The statements are the store's own, handed over as
//! text: this module owns no SQL.
//!
//! It must run over the same SQLite library as the rest of the process (the system's, linked
//! dynamically): two copies of SQLite in one process do not see each other's POSIX locks, and a
//! connection closed by one would drop the locks the other holds on the same file.

pub use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use std::collections::HashMap;
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Records one transaction takes at most (as the store's Python writer).
pub const MAX_GROUP: usize = 256;
/// The thread's name (at most 15 bytes: Linux keeps no more of it, and tools read it there).
pub const THREAD_NAME: &str = "cs-core-writer";
/// How many SQLite virtual-machine steps run between two looks at the deadline.
const DEADLINE_STEPS: i32 = 1000;

/// The store's statements, each with `?` parameters in the order given below.
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

/// The room a group must plainly find on the disk: its claims, less the slack the store allows,
/// within the disk's free space above the reserve and beyond what the WAL holds.
pub struct Room {
    /// The folder holding the database (the disk asked for its free space).
    pub folder: PathBuf,
    pub wal: PathBuf,
    pub reserve: i64,
    pub slack: i64,
}

impl Room {
    fn plainly_fits(&self, claims: i64) -> io::Result<bool> {
        let wal = match std::fs::metadata(&self.wal) {
            Ok(found) => i64::try_from(found.len()).unwrap_or(i64::MAX),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(disk_free(&self.folder)? - self.reserve - wal >= claims - self.slack)
    }
}

/// The bytes an unprivileged writer may still take on the filesystem holding `folder`.
fn disk_free(folder: &std::path::Path) -> io::Result<i64> {
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(folder.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut found = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a NUL-terminated string and `found` a buffer of the size statvfs fills.
    if unsafe { libc::statvfs(path.as_ptr(), found.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `found`.
    let found = unsafe { found.assume_init() };
    let bytes = u128::from(found.f_bavail) * u128::from(found.f_frsize);
    Ok(i64::try_from(bytes).unwrap_or(i64::MAX))
}

/// What a group's write came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// Every record is committed.
    Stored,
    /// Nothing is (see the module's doc).
    Declined,
}

/// A connection that writes groups of records.
pub struct GroupWriter {
    connection: Connection,
    statements: Statements,
    room: Option<Room>,
    bound: Option<Duration>,
}

impl GroupWriter {
    /// A connection to the database at `path`, set up by the store's `setup` statements (its
    /// pragmas: busy timeout, WAL, synchronous, foreign keys). A group must find `room` (None: no
    /// check) and is interrupted past `bound` (None: none).
    pub fn open(
        path: &str,
        setup: &[String],
        statements: Statements,
        room: Option<Room>,
        bound: Option<Duration>,
    ) -> rusqlite::Result<Self> {
        let connection = Connection::open(path)?;
        for statement in setup {
            // A pragma may answer with a row (journal_mode does): read and dropped.
            connection.query_row(statement, [], |_| Ok(())).optional()?;
        }
        Ok(GroupWriter { connection, statements, room, bound })
    }

    /// Commits `records` in one write transaction (`BEGIN IMMEDIATE`), or declines them (see
    /// `Written`). An error of SQLite rolls all of them back, as does the deadline
    /// (SQLITE_INTERRUPT).
    pub fn write(&mut self, records: &[Record]) -> rusqlite::Result<Written> {
        if let Some(room) = &self.room {
            // A disk that cannot say its free space is the store's path's to report.
            if !room.plainly_fits(records.iter().map(|r| r.claim).sum()).unwrap_or(false) {
                return Ok(Written::Declined);
            }
        }
        if let Some(bound) = self.bound {
            let deadline = Instant::now() + bound;
            self.connection.progress_handler(DEADLINE_STEPS, Some(move || Instant::now() >= deadline))?;
        }
        let statements = &self.statements;
        let tx = self.connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // The chats' current audits: read when a chat is first met (no other writer runs while
        // this transaction holds the write lock), then the ones this group writes.
        let mut current: HashMap<(&str, &str), Option<(String, i64)>> = HashMap::new();
        for record in records {
            let generation = rusqlite::params_from_iter(&record.generation);
            if tx.prepare_cached(&statements.generation)?.execute(generation)? == 0 {
                return Ok(Written::Declined); // the id is another chat's (dropping `tx` rolls back)
            }
            let Some(audit) = &record.audit else { continue };
            let chat = (audit.tenant.as_str(), audit.chat_id.as_str());
            let now = match current.get(&chat) {
                Some(now) => now.clone(),
                None => tx
                    .prepare_cached(&statements.current_audit)?
                    .query_row([chat.0, chat.1], |row| Ok((row.get(2)?, row.get(3)?)))
                    .optional()?,
            };
            if now != audit.made_on {
                return Ok(Written::Declined);
            }
            tx.prepare_cached(&statements.audit)?.execute(rusqlite::params_from_iter(&audit.row))?;
            let mut insert = tx.prepare_cached(&statements.segment)?;
            for (hash, data) in &audit.new_segments {
                insert.execute(rusqlite::params![chat.0, chat.1, hash, data])?;
            }
            let mut delete = tx.prepare_cached(&statements.delete_segment)?;
            for hash in &audit.gone_segments {
                delete.execute(rusqlite::params![chat.0, chat.1, hash])?;
            }
            current.insert(chat, Some(audit.key.clone()));
        }
        tx.commit()?;
        Ok(Written::Stored)
    }
}

/// Why a group was not written: SQLite's error (its extended code), or none of SQLite's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: Option<i32>,
    pub message: String,
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        match &error {
            rusqlite::Error::SqliteFailure(failure, message) => Failure {
                code: Some(failure.extended_code),
                message: message.clone().unwrap_or_else(|| failure.to_string()),
            },
            _ => Failure { code: None, message: error.to_string() },
        }
    }
}

/// A record's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Stored,
    /// Its group was declined: the store's own path must write it.
    Declined,
    Failed(Failure),
}

/// What the thread has finished since the last look: each record's outcome by its token, and each
/// group's size and how long its write took.
#[derive(Default)]
pub struct Finished {
    pub records: Vec<(u64, Outcome)>,
    pub groups: Vec<(usize, Duration)>,
}

/// A `GroupWriter` on a thread of its own (see the module's doc).
pub struct WriterThread {
    queue: Option<Sender<(u64, Record)>>,
    finished: Arc<Mutex<Finished>>,
    // Read by the event loop; a byte is written to the other end when `finished` stops being empty.
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
    // The process that started the thread: a forked child has a copy of this value but not the
    // thread, and must neither join it nor close its connection.
    pid: u32,
}

impl WriterThread {
    pub fn start(writer: GroupWriter) -> io::Result<Self> {
        let (wake, waker) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        waker.set_nonblocking(true)?;
        let (queue, queued) = mpsc::channel();
        let finished = Arc::new(Mutex::new(Finished::default()));
        let shared = Arc::clone(&finished);
        let thread =
            std::thread::Builder::new().name(THREAD_NAME.into()).spawn(move || run(writer, &queued, &shared, waker))?;
        Ok(WriterThread { queue: Some(queue), finished, wake, thread: Some(thread), pid: std::process::id() })
    }

    /// The socket that becomes readable when records are finished.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Queues a record under `token`; false when the thread has stopped (nothing queued).
    pub fn submit(&self, token: u64, record: Record) -> bool {
        self.queue.as_ref().is_some_and(|queue| queue.send((token, record)).is_ok())
    }

    /// What is finished (see `Finished`), and the wake-up socket read empty.
    pub fn finished(&self) -> Finished {
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

impl Drop for WriterThread {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock(finished: &Mutex<Finished>) -> MutexGuard<'_, Finished> {
    finished.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn run(mut writer: GroupWriter, queued: &Receiver<(u64, Record)>, finished: &Mutex<Finished>, mut waker: UnixStream) {
    while let Ok(first) = queued.recv() {
        let (mut tokens, mut records) = (vec![first.0], vec![first.1]);
        while records.len() < MAX_GROUP {
            let Ok((token, record)) = queued.try_recv() else { break };
            tokens.push(token);
            records.push(record);
        }
        let started = Instant::now();
        let outcome = match catch_unwind(AssertUnwindSafe(|| writer.write(&records))) {
            Ok(Ok(Written::Stored)) => Outcome::Stored,
            Ok(Ok(Written::Declined)) => Outcome::Declined,
            Ok(Err(e)) => Outcome::Failed(e.into()),
            Err(_) => Outcome::Failed(Failure { code: None, message: "the core's group writer panicked".into() }),
        };
        let mut done = lock(finished);
        let was_empty = done.records.is_empty();
        done.records.extend(tokens.into_iter().map(|token| (token, outcome.clone())));
        done.groups.push((records.len(), started.elapsed()));
        drop(done);
        if was_empty {
            // Full only when the loop has not read the bytes of earlier wake-ups: woken already.
            let _ = waker.write(&[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = "
        CREATE TABLE generations (tenant TEXT, generation_id TEXT, chat_id TEXT, created_ms INTEGER,
            PRIMARY KEY (tenant, generation_id));
        CREATE TABLE audits (tenant TEXT, chat_id TEXT, generation_id TEXT, payload BLOB,
            PRIMARY KEY (tenant, chat_id),
            FOREIGN KEY (tenant, generation_id) REFERENCES generations (tenant, generation_id));
        CREATE TABLE audit_segments (tenant TEXT, chat_id TEXT, segment_hash BLOB, data BLOB,
            PRIMARY KEY (tenant, chat_id, segment_hash));";

    fn statements() -> Statements {
        Statements {
            current_audit:
                "SELECT a.tenant, a.chat_id, g.generation_id, g.created_ms FROM audits a JOIN generations g \
                ON g.tenant = a.tenant AND g.generation_id = a.generation_id \
                WHERE a.tenant = ? AND a.chat_id = ?"
                    .into(),
            generation: "INSERT INTO generations VALUES (?, ?, ?, ?) ON CONFLICT (tenant, generation_id) \
                DO UPDATE SET created_ms = excluded.created_ms WHERE generations.chat_id = excluded.chat_id"
                .into(),
            audit: "INSERT INTO audits VALUES (?, ?, ?, ?) ON CONFLICT (tenant, chat_id) \
                DO UPDATE SET generation_id = excluded.generation_id, payload = excluded.payload"
                .into(),
            segment: "INSERT INTO audit_segments VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING".into(),
            delete_segment: "DELETE FROM audit_segments WHERE tenant = ? AND chat_id = ? AND segment_hash = ?".into(),
        }
    }

    fn writer() -> GroupWriter {
        // journal_mode answers with a row, foreign_keys with none: setup reads either.
        let setup = ["PRAGMA journal_mode = WAL".to_owned(), "PRAGMA foreign_keys = ON".to_owned()];
        let w = GroupWriter::open(":memory:", &setup, statements(), None, None).unwrap();
        w.connection.execute_batch(SCHEMA).unwrap();
        w
    }

    fn record(chat: &str, id: &str, ms: i64, made_on: Option<(&str, i64)>, new: &[&[u8]], gone: &[&[u8]]) -> Record {
        let text = |s: &str| Value::Text(s.to_owned());
        Record {
            generation: vec![text("t"), text(id), text(chat), Value::Integer(ms)],
            audit: Some(AuditWrite {
                tenant: "t".into(),
                chat_id: chat.into(),
                made_on: made_on.map(|(id, ms)| (id.to_owned(), ms)),
                key: (id.to_owned(), ms),
                row: vec![text("t"), text(chat), text(id), Value::Blob(id.as_bytes().to_vec())],
                new_segments: new.iter().map(|h| (h.to_vec(), b"data".to_vec())).collect(),
                gone_segments: gone.iter().map(|h| h.to_vec()).collect(),
            }),
            claim: 100,
        }
    }

    fn rows(w: &GroupWriter, sql: &str) -> Vec<String> {
        let mut statement = w.connection.prepare(sql).unwrap();
        let found = statement.query_map([], |row| row.get::<_, String>(0)).unwrap();
        found.map(Result::unwrap).collect()
    }

    #[test]
    fn a_group_writes_each_chats_audits_in_turn_checked_against_the_one_before() {
        let mut w = writer();
        let group = [
            record("a", "g1", 1, None, &[b"s1"], &[]),
            record("b", "g2", 2, None, &[b"s2"], &[]),
            record("a", "g3", 3, Some(("g1", 1)), &[b"s3"], &[b"s1"]),
        ];
        assert_eq!(w.write(&group).unwrap(), Written::Stored);
        assert_eq!(rows(&w, "SELECT generation_id FROM audits ORDER BY chat_id"), ["g3", "g2"]);
        assert_eq!(rows(&w, "SELECT CAST(segment_hash AS TEXT) FROM audit_segments ORDER BY 1"), ["s2", "s3"]);
        assert_eq!(rows(&w, "SELECT generation_id FROM generations ORDER BY 1"), ["g1", "g2", "g3"]);
    }

    #[test]
    fn a_record_made_on_an_audit_no_longer_current_declines_the_group() {
        let mut w = writer();
        assert_eq!(w.write(&[record("a", "g1", 1, None, &[], &[])]).unwrap(), Written::Stored);
        // Made against no audit, but the chat has one; then against one it never had.
        for made_on in [None, Some(("g0", 1))] {
            let group = [record("b", "g2", 2, None, &[b"s"], &[]), record("a", "g3", 3, made_on, &[], &[])];
            assert_eq!(w.write(&group).unwrap(), Written::Declined);
            assert_eq!(rows(&w, "SELECT generation_id FROM generations"), ["g1"]);
            assert!(rows(&w, "SELECT chat_id FROM audit_segments").is_empty());
        }
    }

    #[test]
    fn a_generation_id_another_chat_uses_declines_the_group() {
        let mut w = writer();
        assert_eq!(w.write(&[record("a", "g1", 1, None, &[], &[])]).unwrap(), Written::Stored);
        let group = [record("b", "g2", 2, None, &[], &[]), record("c", "g1", 3, None, &[], &[])];
        assert_eq!(w.write(&group).unwrap(), Written::Declined);
        assert_eq!(rows(&w, "SELECT chat_id FROM audits"), ["a"]);
    }

    #[test]
    fn an_error_of_sqlite_is_returned_and_nothing_of_the_group_stays() {
        let mut w = writer();
        let mut bad = record("b", "g2", 2, None, &[], &[]);
        bad.audit.as_mut().unwrap().row.push(Value::Null); // one parameter too many
        assert!(w.write(&[record("a", "g1", 1, None, &[], &[]), bad]).is_err());
        assert!(rows(&w, "SELECT generation_id FROM generations").is_empty());
        // The connection writes again afterwards.
        assert_eq!(w.write(&[record("a", "g1", 1, None, &[], &[])]).unwrap(), Written::Stored);
    }

    #[test]
    fn a_group_the_disk_has_no_plain_room_for_is_declined_unwritten() {
        let folder = std::env::temp_dir();
        let free = disk_free(&folder).unwrap();
        assert!(free > 0);
        let room = |reserve| Room { folder: folder.clone(), wal: folder.join("no-such-wal"), reserve, slack: 50 };
        let mut w = writer();
        w.room = Some(room(free)); // all of it reserved: a claim of 100 less 50 of slack does not fit
        assert_eq!(w.write(&[record("a", "g1", 1, None, &[], &[])]).unwrap(), Written::Declined);
        assert!(rows(&w, "SELECT generation_id FROM generations").is_empty());
        w.room = Some(room(0));
        assert_eq!(w.write(&[record("a", "g1", 1, None, &[], &[])]).unwrap(), Written::Stored);
    }

    #[test]
    fn a_group_past_its_bound_is_interrupted_and_rolled_back() {
        let mut w = writer();
        w.bound = Some(Duration::ZERO);
        let group: Vec<_> = (0..200).map(|i| record(&format!("c{i}"), &format!("g{i}"), i, None, &[], &[])).collect();
        let error = w.write(&group).unwrap_err();
        assert_eq!(Failure::from(error).code, Some(9)); // SQLITE_INTERRUPT
        assert!(rows(&w, "SELECT generation_id FROM generations").is_empty());
    }

    #[test]
    fn the_thread_commits_what_queued_and_wakes_its_reader_once_per_batch() {
        let mut thread = WriterThread::start(writer()).unwrap();
        let readable = |fd: RawFd| {
            let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut poll, 1, 5000) == 1 }
        };
        assert!(thread.submit(1, record("a", "g1", 1, None, &[], &[])));
        assert!(readable(thread.wake_fd()));
        let finished = thread.finished();
        assert_eq!(finished.records, [(1, Outcome::Stored)]);
        assert_eq!(finished.groups.iter().map(|g| g.0).collect::<Vec<_>>(), [1]);
        // A record made against an audit the chat no longer has: declined.
        assert!(thread.submit(2, record("a", "g2", 2, None, &[], &[])));
        assert!(readable(thread.wake_fd()));
        assert_eq!(thread.finished().records, [(2, Outcome::Declined)]);
        // Stopping writes what is queued first.
        for token in 3..6 {
            assert!(
                thread.submit(token, record(&format!("c{token}"), &format!("g{token}"), token as i64, None, &[], &[]))
            );
        }
        thread.stop();
        assert_eq!(thread.finished().records, [(3, Outcome::Stored), (4, Outcome::Stored), (5, Outcome::Stored)]);
        assert!(!thread.submit(6, record("d", "g6", 6, None, &[], &[])));
    }
}
