//! The SQLite store's group commits (`store_group`), over a connection of the core's own.
//!
//! A group is also declined when the disk does not plainly have room for it (the store's path then
//! claims room record by record).
//!
//! It must run over the same SQLite library as the rest of the process (the system's, linked
//! dynamically): two copies of SQLite in one process do not see each other's POSIX locks, and a
//! connection closed by one would drop the locks the other holds on the same file.

use crate::store_group::{made_on_current, AuditWrite, GroupStore, Record, Statements, Value, Written};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, ToSql, TransactionBehavior};
use std::ffi::CString;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How many SQLite virtual-machine steps run between two looks at the deadline.
const DEADLINE_STEPS: i32 = 1000;

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
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

/// A connection that writes groups of records (`GroupStore`).
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
}

impl GroupStore for GroupWriter {
    type Failure = Failure;

    /// Commits `records` in one write transaction (`BEGIN IMMEDIATE`), or declines them (see
    /// `Written`). An error of SQLite rolls all of them back, as does the deadline
    /// (SQLITE_INTERRUPT).
    fn write(&mut self, records: &[Record]) -> Result<Written, Failure> {
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
        // No other writer runs while this transaction holds the write lock: the audits read here
        // stay current until it commits. Dropping `tx` on a decline rolls back.
        let read = |audit: &AuditWrite| {
            let chat = [&audit.tenant, &audit.chat_id];
            tx.prepare_cached(&statements.current_audit)?
                .query_row(chat, |row| Ok((row.get(2)?, row.get(3)?)))
                .optional()
        };
        if !made_on_current(records, read)? {
            return Ok(Written::Declined);
        }
        for record in records {
            let generation = rusqlite::params_from_iter(&record.generation);
            if tx.prepare_cached(&statements.generation)?.execute(generation)? == 0 {
                return Ok(Written::Declined); // the id is another chat's
            }
            let Some(audit) = &record.audit else { continue };
            let chat = (audit.tenant.as_str(), audit.chat_id.as_str());
            tx.prepare_cached(&statements.audit)?.execute(rusqlite::params_from_iter(&audit.row))?;
            let mut insert = tx.prepare_cached(&statements.segment)?;
            for (hash, data) in &audit.new_segments {
                insert.execute(rusqlite::params![chat.0, chat.1, hash, data])?;
            }
            let mut delete = tx.prepare_cached(&statements.delete_segment)?;
            for hash in &audit.gone_segments {
                delete.execute(rusqlite::params![chat.0, chat.1, hash])?;
            }
        }
        tx.commit()?;
        Ok(Written::Stored)
    }

    fn panicked() -> Failure {
        Failure { code: None, message: "the core's group writer panicked".into() }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store_group::{Job, Outcome, WriterThread};
    use std::os::fd::RawFd;

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
                lock_key: chat.into(),
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
        assert_eq!(error.code, Some(9)); // SQLITE_INTERRUPT
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
        assert!(thread.submit(1, Job::Write(record("a", "g1", 1, None, &[], &[]))));
        assert!(readable(thread.wake_fd()));
        let finished = thread.finished();
        assert_eq!(finished.records, [(1, Outcome::Stored)]);
        assert_eq!(finished.groups.iter().map(|g| g.0).collect::<Vec<_>>(), [1]);
        // A record made against an audit the chat no longer has: declined.
        assert!(thread.submit(2, Job::Write(record("a", "g2", 2, None, &[], &[]))));
        assert!(readable(thread.wake_fd()));
        assert_eq!(thread.finished().records, [(2, Outcome::Declined)]);
        // SQLite's reads need not wait: the store reads them itself, and the thread declines them.
        assert!(thread.submit(7, Job::Read(vec![Value::Text("t".into()), Value::Text("a".into())])));
        assert!(readable(thread.wake_fd()));
        assert_eq!(thread.finished().records, [(7, Outcome::Declined)]);
        // Stopping writes what is queued first.
        for token in 3..6 {
            assert!(thread.submit(
                token,
                Job::Write(record(&format!("c{token}"), &format!("g{token}"), token as i64, None, &[], &[]))
            ));
        }
        thread.stop();
        assert_eq!(thread.finished().records, [(3, Outcome::Stored), (4, Outcome::Stored), (5, Outcome::Stored)]);
        assert!(!thread.submit(6, Job::Write(record("d", "g6", 6, None, &[], &[]))));
    }
}
