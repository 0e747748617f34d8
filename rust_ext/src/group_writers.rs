//! The stores' group commits outside Python (`contextshift_core::store_group`): a record is copied
//! under the GIL when submitted, and everything after runs on the core's own thread. SQLite's
//! errors come back as the `sqlite3` module raises them (its exception classes, with
//! `sqlite_errorcode`), so the store reads them as it reads its own connections'; PostgreSQL's
//! writer fails a group only as `TimeoutError` (no answer within the bound) or `ConnectionError`
//! (broken with its COMMIT sent, or the database taken for down), declining it in every other case.

use crate::boundary::{guarded, InternalError};
use contextshift_core::postgres_group;
use contextshift_core::sqlite_group::{self, Room};
use contextshift_core::store_group::{AuditWrite, GroupStore, Job, Outcome, Record, Statements, Value, WriterThread};
use pyo3::exceptions::{PyConnectionError, PyMemoryError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBool, PyBytes, PyInt, PyString, PyTuple};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The sqlite3 module's exceptions (its `InternalError` is not contextshift's).
mod sqlite3 {
    pyo3::import_exception!(sqlite3, DatabaseError);
    pyo3::import_exception!(sqlite3, DataError);
    pyo3::import_exception!(sqlite3, IntegrityError);
    pyo3::import_exception!(sqlite3, InterfaceError);
    pyo3::import_exception!(sqlite3, InternalError);
    pyo3::import_exception!(sqlite3, OperationalError);
}

/// The five statements every store's writer takes (see `Statements`).
type StatementArgs = (String, String, String, String, String);

fn statements(args: StatementArgs) -> Statements {
    let (current_audit, generation, audit, segment, delete_segment) = args;
    Statements { current_audit, generation, audit, segment, delete_segment }
}

/// A store's writer thread, shared by both classes: what they do once made.
struct Writer<S: GroupStore> {
    thread: Mutex<WriterThread<S>>,
    wake_fd: i32,
}

impl<S: GroupStore> Writer<S> {
    fn start(store: S) -> PyResult<Self> {
        let thread = WriterThread::start(store).map_err(|e| InternalError::new_err(e.to_string()))?;
        let wake_fd = thread.wake_fd();
        Ok(Writer { thread: Mutex::new(thread), wake_fd })
    }

    fn lock(&self) -> MutexGuard<'_, WriterThread<S>> {
        self.thread.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn submit(&self, token: u64, record: &Bound<'_, PyAny>) -> PyResult<bool> {
        guarded(|| Ok(self.lock().submit(token, Job::Write(read_record(record)?))))
    }

    fn finished(&self, py: Python<'_>, raised: impl Fn(S::Failure) -> PyErr) -> PyResult<FinishedTuple> {
        guarded(|| {
            let finished = self.lock().finished();
            let records = finished
                .records
                .into_iter()
                .map(|(token, outcome)| -> PyResult<(u64, Py<PyAny>)> {
                    let outcome = match outcome {
                        Outcome::Stored => py.None(),
                        Outcome::Declined => PyBool::new(py, false).to_owned().into_any().unbind(),
                        Outcome::Failed(failure) => raised(failure).into_value(py).into_any(),
                        Outcome::Read(row) => read_row(py, row)?,
                    };
                    Ok((token, outcome))
                })
                .collect::<PyResult<_>>()?;
            let groups = finished.groups.into_iter().map(|(size, took)| (size, took.as_secs_f64())).collect();
            Ok((records, groups, finished.notices))
        })
    }

    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.lock().stop());
    }
}

type FinishedTuple = (Vec<(u64, Py<PyAny>)>, Vec<(usize, f64)>, Vec<String>);

/// A read's outcome: `(row,)`, the row a tuple of None, int, str and bytes (None: no row).
fn read_row(py: Python<'_>, row: Option<Vec<Value>>) -> PyResult<Py<PyAny>> {
    let row = match row {
        None => py.None(),
        Some(values) => {
            let values = values.into_iter().map(|value| -> PyResult<Py<PyAny>> {
                Ok(match value {
                    Value::Null => py.None(),
                    Value::Integer(i) => i.into_pyobject(py)?.into_any().unbind(),
                    Value::Text(s) => s.into_pyobject(py)?.into_any().unbind(),
                    Value::Blob(b) => PyBytes::new(py, &b).into_any().unbind(),
                })
            });
            PyTuple::new(py, values.collect::<PyResult<Vec<_>>>()?)?.into_any().unbind()
        }
    };
    Ok(PyTuple::new(py, [row])?.into_any().unbind())
}

/// One connection to a SQLite store, on a thread of its own, that commits groups of shift records.
#[pyclass(frozen, name = "SqliteGroupWriter", module = "contextshift._core")]
pub(crate) struct PySqliteGroupWriter(Writer<sqlite_group::GroupWriter>);

type RoomArgs = (PathBuf, PathBuf, i64, i64);

#[pymethods]
impl PySqliteGroupWriter {
    /// Opens the database at `path`, runs `setup` (its pragmas), keeps `statements` (a chat's
    /// current audit, a generation, an audit, a segment, a segment's deletion) and starts the
    /// thread. A group must plainly find `room` (folder, WAL path, reserve, slack; None: no check)
    /// and is interrupted past `bound_seconds` (None: none).
    #[new]
    #[pyo3(signature = (path, setup, statements, room, bound_seconds))]
    fn new(
        py: Python<'_>,
        path: String,
        setup: Vec<String>,
        statements: StatementArgs,
        room: Option<RoomArgs>,
        bound_seconds: Option<f64>,
    ) -> PyResult<Self> {
        guarded(|| {
            let statements = self::statements(statements);
            let room = room.map(|(folder, wal, reserve, slack)| Room { folder, wal, reserve, slack });
            let bound = bound_seconds.map(Duration::from_secs_f64);
            let writer = py
                .detach(|| sqlite_group::GroupWriter::open(&path, &setup, statements, room, bound))
                .map_err(|e| sqlite_raised(e.into()))?;
            Ok(PySqliteGroupWriter(Writer::start(writer)?))
        })
    }

    /// The socket that becomes readable when records are finished (`finished`).
    fn fileno(&self) -> i32 {
        self.0.wake_fd
    }

    /// Queues `record` under `token`: `(generation, audit, claim)`, the generation's parameters,
    /// None or `(tenant, chat_id, lock_key, made_on, key, row, new_segments, gone_segments)`, and
    /// the bytes it claims. False when the thread has stopped (nothing queued).
    fn submit(&self, token: u64, record: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.0.submit(token, record)
    }

    /// The records finished since the last call, `(token, outcome)`: None stored, False declined
    /// (the store's own path must write it), or the exception that failed its group; each group's
    /// `(size, seconds)`; and what the log should say of the connection (none for SQLite's).
    fn finished(&self, py: Python<'_>) -> PyResult<FinishedTuple> {
        self.0.finished(py, sqlite_raised)
    }

    /// Writes what is queued, then stops the thread (its finished records are still read).
    fn stop(&self, py: Python<'_>) {
        self.0.stop(py);
    }
}

/// A connection of the core's own to a PostgreSQL store, on a thread of its own, that commits
/// groups of shift records (connected when the first comes).
#[pyclass(frozen, name = "PostgresGroupWriter", module = "contextshift._core")]
pub(crate) struct PyPostgresGroupWriter(Writer<postgres_group::GroupWriter>);

#[pymethods]
impl PyPostgresGroupWriter {
    /// Keeps `conninfo` (libpq's `key=value` form, with the keys tokio-postgres knows),
    /// `statements` (as `SqliteGroupWriter`'s, with `$n` parameters), `lock` (the chats' advisory
    /// locks, their keys as one text[] parameter) and `audit_read` (a chat's audit: tenant, chat
    /// id), and starts the thread. A group or a read fails past `bound_seconds` (None: none).
    #[new]
    #[pyo3(signature = (conninfo, statements, lock, audit_read, bound_seconds))]
    fn new(
        conninfo: &str,
        statements: StatementArgs,
        lock: String,
        audit_read: String,
        bound_seconds: Option<f64>,
    ) -> PyResult<Self> {
        guarded(|| {
            let bound = bound_seconds.map(Duration::from_secs_f64);
            let statements = self::statements(statements);
            let writer = postgres_group::GroupWriter::new(conninfo, statements, lock, audit_read, bound)
                .map_err(|e| PyValueError::new_err(format!("the core's PostgreSQL writer: {e}")))?;
            Ok(PyPostgresGroupWriter(Writer::start(writer)?))
        })
    }

    fn fileno(&self) -> i32 {
        self.0.wake_fd
    }

    fn submit(&self, token: u64, record: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.0.submit(token, record)
    }

    /// Queues a read of a chat's audit under `token` (`(tenant, chat_id)`): its outcome is `(row,)`
    /// (None: no audit), False declined (the store's own path must read it), or why it failed.
    fn submit_read(&self, token: u64, chat: (String, String)) -> PyResult<bool> {
        guarded(|| Ok(self.0.lock().submit(token, Job::Read(vec![Value::Text(chat.0), Value::Text(chat.1)]))))
    }

    fn finished(&self, py: Python<'_>) -> PyResult<FinishedTuple> {
        self.0.finished(py, postgres_raised)
    }

    fn stop(&self, py: Python<'_>) {
        self.0.stop(py);
    }
}

type AuditTuple<'py> = (
    String,
    String,
    String,
    Option<(String, i64)>,
    (String, i64),
    Bound<'py, PyAny>,
    Vec<(PyBackedBytes, PyBackedBytes)>,
    Vec<PyBackedBytes>,
);

fn read_record(record: &Bound<'_, PyAny>) -> PyResult<Record> {
    let (generation, audit, claim): (Bound<'_, PyAny>, Option<Bound<'_, PyAny>>, i64) =
        record.extract().map_err(|e| problem("the record", e))?;
    let generation = values(&generation).map_err(|e| problem("its generation", e))?;
    let Some(audit) = audit else { return Ok(Record { generation, audit: None, claim }) };
    let (tenant, chat_id, lock_key, made_on, key, row, new, gone): AuditTuple<'_> =
        audit.extract().map_err(|e| problem("its audit", e))?;
    Ok(Record {
        generation,
        audit: Some(AuditWrite {
            tenant,
            chat_id,
            lock_key,
            made_on,
            key,
            row: values(&row).map_err(|e| problem("its audit's row", e))?,
            new_segments: new.iter().map(|(hash, data)| (hash.to_vec(), data.to_vec())).collect(),
            gone_segments: gone.iter().map(|hash| hash.to_vec()).collect(),
        }),
        claim,
    })
}

/// A statement's parameters, as sqlite3 binds them: None, int (and bool), str, bytes.
fn values(params: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    params
        .try_iter()?
        .enumerate()
        .map(|(at, param)| {
            let param = param?;
            if param.is_none() {
                Ok(Value::Null)
            } else if let Ok(b) = param.cast::<PyBool>() {
                Ok(Value::Integer(i64::from(b.is_true())))
            } else if param.is_instance_of::<PyInt>() {
                Ok(Value::Integer(param.extract()?))
            } else if let Ok(s) = param.cast::<PyString>() {
                Ok(Value::Text(s.to_str()?.to_owned()))
            } else if let Ok(b) = param.cast::<PyBytes>() {
                Ok(Value::Blob(b.as_bytes().to_vec()))
            } else {
                let kind = param.get_type().name()?;
                Err(PyTypeError::new_err(format!("parameter {at} is a {kind}, not None, int, str or bytes")))
            }
        })
        .collect()
}

fn problem(what: &str, e: PyErr) -> PyErr {
    Python::attach(|py| PyTypeError::new_err(format!("{what}: {}", e.value(py))))
}

/// SQLite's error as the sqlite3 module raises it (by its primary code, the low byte, grouped as
/// sqlite3 groups them); anything else (a parameter rusqlite cannot bind, a panic) is a bug here.
fn sqlite_raised(failure: sqlite_group::Failure) -> PyErr {
    let Some(code) = failure.code else {
        return InternalError::new_err(format!("the core's SQLite writer: {}", failure.message));
    };
    let message = failure.message;
    let error = match code & 0xff {
        2 | 12 => sqlite3::InternalError::new_err(message),
        7 => return PyMemoryError::new_err(message),
        1 | 3..=6 | 8..=10 | 13..=17 => sqlite3::OperationalError::new_err(message),
        18 => sqlite3::DataError::new_err(message),
        19 | 20 => sqlite3::IntegrityError::new_err(message),
        21 | 25 => sqlite3::InterfaceError::new_err(message),
        _ => sqlite3::DatabaseError::new_err(message),
    };
    Python::attach(|py| match error.value(py).setattr("sqlite_errorcode", code) {
        Ok(()) => error,
        Err(e) => e,
    })
}

fn postgres_raised(failure: postgres_group::Failure) -> PyErr {
    match failure {
        postgres_group::Failure::TimedOut(message) => PyTimeoutError::new_err(message),
        postgres_group::Failure::Unavailable(message) => PyConnectionError::new_err(message),
        postgres_group::Failure::Internal(message) => InternalError::new_err(message),
    }
}
