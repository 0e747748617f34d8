//! The PostgreSQL store's group commits (`store_group`), over a connection of the core's own.
//!
//! A group is three round trips, as the store's Python path makes it: `BEGIN`, the chats' advisory
//! locks (in one order in every transaction) and their current audits; every record's statements;
//! `COMMIT`. Statements on one table are prepared once per connection; the read that joins two
//! tables is planned at each use, as the store's path plans its joins (`audit/postgres.py`).
//!
//! What the store's path handles, the group leaves to it by declining (nothing written): an error
//! of the database (a deadlock or a serialization conflict it retries, a full disk it reports
//! record by record), a connection that cannot be made or that broke before `COMMIT` was sent (its
//! outage handling says whether the database is down). The core fails a group itself only when
//! the store's path could not do better: no answer within the store's bound (the connection is
//! dropped, and the call ends by its bound), or a connection that broke with `COMMIT` under way
//! (stored or not, nobody can say). A bound passed means the database does not answer, as the
//! store's path reads it: until a new connection is made, groups fail at once (one attempt every
//! `RETRY`, within the bound), where each would otherwise wait out the bound in turn. A connection
//! refused is told to the process's log once (`GroupStore::notices`), and again when one is made.
//!
//! A chat's audit is read here too, for a shift the event loop would otherwise send to a thread
//! (the store's Python reads block): the reads queued together in one round trip, each planned at
//! its use (a join). One that fails is declined: the store's path reads it, and says why.

use crate::store_group::{made_on_current, AuditWrite, GroupStore, Record, Row, Statements, Value, Written};
use bytes::BytesMut;
use futures_util::future::{try_join3, try_join_all, BoxFuture};
use std::cell::Cell;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Statement};

/// How long after a connection attempt failed, or a connection was dropped, the next may start.
pub const RETRY: Duration = Duration::from_millis(250);
/// How long a connection attempt may take without a bound (as the store's path's).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl ToSql for Value {
    /// As its column's type needs it: an integer as a boolean, a smallint, an integer or a bigint;
    /// text as text; bytes as bytea.
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(i) => match *ty {
                Type::BOOL => (*i != 0).to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT8 => i.to_sql(ty, out),
                _ => Err(format!("an integer for a parameter of type {ty}").into()),
            },
            Value::Text(s) if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
            Value::Blob(b) if <&[u8] as ToSql>::accepts(ty) => b.as_slice().to_sql(ty, out),
            Value::Text(_) | Value::Blob(_) => Err(format!("{self:?} for a parameter of type {ty}").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true // each value is checked against its parameter's type in `to_sql`
    }

    to_sql_checked!();
}

/// Why a group was not written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No answer within the store's bound (its COMMIT, when already sent, may have landed).
    TimedOut(String),
    /// The connection broke with the group's COMMIT under way (stored or not, nobody can say), or
    /// the database did not answer the last group within the bound and no new connection is made.
    Unavailable(String),
    /// A bug here (a panic).
    Internal(String),
}

/// A connection of the core's own that writes groups of records (`GroupStore`).
pub struct GroupWriter {
    config: Config,
    statements: Statements,
    /// The chats' advisory locks (one parameter: their keys, as text[]).
    lock: String,
    /// A chat's audit (tenant, chat id): the row the store's path reads.
    audit_read: String,
    bound: Option<Duration>,
    runtime: Runtime,
    session: Option<Session>,
    retry_at: Option<Instant>,
    /// Why the database is taken for down (it did not answer within the bound), and since when.
    down: Option<(String, Instant)>,
    /// Whether the last connection attempt was refused (told once, until one is made again).
    refused: bool,
    notices: Vec<String>,
}

/// A live connection and its prepared statements.
struct Session {
    client: Client,
    generation: Statement,
    audit: Statement,
    segment: Statement,
    delete_segment: Statement,
    lock: Statement,
    /// The task that runs the connection's socket (`GroupWriter::end_session` closes it).
    connection: JoinHandle<()>,
}

impl GroupWriter {
    /// A writer to the database `conninfo` names (connected when its first group comes). A group
    /// takes `lock`, a read runs `audit_read` (see the fields), and either fails past `bound`
    /// (None: none).
    pub fn new(
        conninfo: &str,
        statements: Statements,
        lock: String,
        audit_read: String,
        bound: Option<Duration>,
    ) -> Result<Self, Box<dyn StdError + Send + Sync>> {
        let config: Config = conninfo.parse()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        Ok(GroupWriter {
            config,
            statements,
            lock,
            audit_read,
            bound,
            runtime,
            session: None,
            retry_at: None,
            down: None,
            refused: false,
            notices: Vec::new(),
        })
    }

    /// A live session for work starting now (and its deadline), or why not (`unconnected`).
    fn start(&mut self) -> Result<Option<Instant>, Result<Written, Failure>> {
        let started = Instant::now();
        let deadline = self.bound.map(|bound| started + bound);
        if self.retry_at.is_some_and(|at| started < at) || !self.connected(deadline) {
            return Err(self.unconnected());
        }
        self.down = None;
        Ok(deadline)
    }

    /// No answer within the bound: the connection dropped, the database taken for down.
    fn timed_out(&mut self) -> Failure {
        self.dropped();
        let bound = self.bound.unwrap_or_default().as_secs_f64();
        let why = format!("PostgreSQL did not answer within the store's bound of {bound:.3} s");
        self.down = Some((why.clone(), Instant::now()));
        Failure::TimedOut(why)
    }

    /// Runs `work` on the runtime, within `deadline` if any; None past it.
    fn within<T>(&self, deadline: Option<Instant>, work: impl std::future::Future<Output = T>) -> Option<T> {
        match deadline {
            None => Some(self.runtime.block_on(work)),
            // The timer made inside the runtime, whose clock it needs.
            Some(at) => self.runtime.block_on(async { tokio::time::timeout_at(at.into(), work).await }).ok(),
        }
    }

    /// Whether a session is live, made now if need be (the next attempt no sooner than `RETRY`
    /// after this one; an attempt without an answer in time takes the database for down).
    fn connected(&mut self, deadline: Option<Instant>) -> bool {
        if self.session.as_ref().is_some_and(|s| s.client.is_closed()) {
            self.end_session();
        }
        if self.session.is_some() {
            return true;
        }
        let started = Instant::now();
        let by = deadline.map_or(started + CONNECT_TIMEOUT, |at| at.min(started + CONNECT_TIMEOUT));
        match self.within(Some(by), open(&self.config, &self.statements, &self.lock)) {
            Some(Ok(session)) => {
                self.session = Some(session);
                if std::mem::take(&mut self.refused) {
                    self.notices.push(
                        "the core's connection to PostgreSQL is made: it writes the groups and reads the chats again"
                            .into(),
                    );
                }
                return true;
            }
            Some(Err(e)) => self.refused_by(&e),
            None if self.down.is_none() => {
                let waited = by.saturating_duration_since(started).as_secs_f64();
                let why = format!("PostgreSQL did not answer a new connection within {waited:.3} s");
                self.down = Some((why, Instant::now()));
            }
            None => {}
        }
        self.retry_at = Some(Instant::now() + RETRY);
        false
    }

    /// A connection attempt refused: its groups are declined to the store's path, which says why
    /// its own connection fails (if it does). Told once until one is made, as a connection only
    /// the store's path can make (a password in ~/.pgpass, which the core does not read) would
    /// otherwise leave the core declining every group unseen.
    fn refused_by(&mut self, error: &tokio_postgres::Error) {
        if !std::mem::replace(&mut self.refused, true) {
            self.notices.push(format!(
                "the core's connection to PostgreSQL was refused ({}): the store's own path writes \
                the groups and reads the chats, and the core tries again every {} ms",
                described(error),
                RETRY.as_millis()
            ));
        }
    }

    /// The session's socket closed now, not when the next group runs the runtime: its backend
    /// rolls back, and lets go of the chats' locks, as soon as it reads the socket.
    fn end_session(&mut self) {
        if let Some(session) = self.session.take() {
            session.connection.abort();
            let _ = self.runtime.block_on(session.connection); // done once the task is dropped
        }
    }

    fn dropped(&mut self) {
        self.end_session();
        self.retry_at = Some(Instant::now() + RETRY);
    }

    /// A group not written for want of a connection: declined, or failed while the database is
    /// taken for down.
    fn unconnected(&self) -> Result<Written, Failure> {
        match &self.down {
            None => Ok(Written::Declined),
            Some((why, since)) => Err(Failure::Unavailable(format!(
                "{why} (down for {:.1} s; a new connection is tried every {} ms)",
                since.elapsed().as_secs_f64(),
                RETRY.as_millis()
            ))),
        }
    }
}

/// An error with its causes (tokio-postgres's own text is only its kind: "db error").
fn described(error: &tokio_postgres::Error) -> String {
    let mut text = error.to_string();
    let mut cause = StdError::source(error);
    while let Some(e) = cause {
        text = format!("{text}: {e}");
        cause = e.source();
    }
    text
}

async fn open(config: &Config, statements: &Statements, lock: &str) -> Result<Session, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    let connection = tokio::spawn(async move {
        let _ = connection.await; // its end is seen by the client (`is_closed`, its calls' errors)
    });
    let prepared = try_join_all(
        [&statements.generation, &statements.audit, &statements.segment, &statements.delete_segment, lock]
            .map(|sql| client.prepare(sql)),
    )
    .await;
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            connection.abort();
            let _ = connection.await;
            return Err(e);
        }
    };
    let [generation, audit, segment, delete_segment, lock] = <[Statement; 5]>::try_from(prepared).expect("five");
    Ok(Session { client, generation, audit, segment, delete_segment, lock, connection })
}

/// A read's row as values (a boolean as an integer, as the store's SQLite rows have it).
fn row_values(row: &tokio_postgres::Row) -> Result<Vec<Value>, tokio_postgres::Error> {
    (0..row.len())
        .map(|at| {
            let value = match *row.columns()[at].type_() {
                Type::BOOL => row.try_get::<_, Option<bool>>(at)?.map(|b| Value::Integer(i64::from(b))),
                Type::INT2 => row.try_get::<_, Option<i16>>(at)?.map(|i| Value::Integer(i64::from(i))),
                Type::INT4 => row.try_get::<_, Option<i32>>(at)?.map(|i| Value::Integer(i64::from(i))),
                Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(at)?.map(Value::Blob),
                Type::INT8 => row.try_get::<_, Option<i64>>(at)?.map(Value::Integer),
                _ => row.try_get::<_, Option<String>>(at)?.map(Value::Text),
            };
            Ok(value.unwrap_or(Value::Null))
        })
        .collect()
}

impl Session {
    /// Each read's first row, in one round trip.
    async fn read(&self, statement: &str, reads: &[Vec<Value>]) -> Result<Vec<Row>, tokio_postgres::Error> {
        let reads = reads.iter().map(|params| async move {
            let typed: Vec<(&(dyn ToSql + Sync), Type)> = params.iter().map(|p| (p as _, Type::TEXT)).collect();
            let rows = self.client.query_typed(statement, &typed).await?;
            rows.first().map(row_values).transpose()
        });
        try_join_all(reads).await
    }

    /// The group's transaction (see the module's doc); `commit_sent` is set once COMMIT is.
    async fn write(
        &self,
        statements: &Statements,
        records: &[Record],
        commit_sent: &Cell<bool>,
    ) -> Result<Written, tokio_postgres::Error> {
        let audits: Vec<&AuditWrite> = records.iter().filter_map(|r| r.audit.as_ref()).collect();
        let mut keys: Vec<&str> = audits.iter().map(|a| a.lock_key.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut chats: Vec<(&str, &str)> = audits.iter().map(|a| (a.tenant.as_str(), a.chat_id.as_str())).collect();
        chats.sort_unstable();
        chats.dedup();
        // First round trip: each future sends its statement when first polled, in this order.
        let locked = async {
            if keys.is_empty() {
                return Ok(0);
            }
            self.client.execute(&self.lock, &[&keys]).await
        };
        let reads = chats.iter().map(|&(tenant, chat_id)| async move {
            let params: [(&(dyn ToSql + Sync), Type); 2] = [(&tenant, Type::TEXT), (&chat_id, Type::TEXT)];
            let rows = self.client.query_typed(&statements.current_audit, &params).await?;
            let now = match rows.first() {
                Some(row) => Some((row.try_get::<_, String>(2)?, row.try_get::<_, i64>(3)?)),
                None => None,
            };
            Ok::<_, tokio_postgres::Error>(((tenant, chat_id), now))
        });
        let (_, _, current) = try_join3(self.client.batch_execute("BEGIN"), locked, try_join_all(reads)).await?;
        let current: HashMap<(&str, &str), Option<(String, i64)>> = current.into_iter().collect();
        let now = |a: &AuditWrite| {
            Ok::<_, std::convert::Infallible>(current.get(&(a.tenant.as_str(), a.chat_id.as_str())).cloned().flatten())
        };
        if !made_on_current(records, now).unwrap_or(false) {
            self.client.batch_execute("ROLLBACK").await?;
            return Ok(Written::Declined);
        }
        // Second: every record's statements; a generation's first (an audit's foreign key needs it).
        let mut writes: Vec<BoxFuture<'_, Result<u64, tokio_postgres::Error>>> = Vec::new();
        let mut generations = Vec::with_capacity(records.len());
        for record in records {
            generations.push(writes.len());
            writes.push(Box::pin(self.client.execute_raw(&self.generation, &record.generation)));
            let Some(audit) = &record.audit else { continue };
            writes.push(Box::pin(self.client.execute_raw(&self.audit, &audit.row)));
            for (hash, data) in &audit.new_segments {
                let params: [&(dyn ToSql + Sync); 4] = [&audit.tenant, &audit.chat_id, hash, data];
                writes.push(Box::pin(self.client.execute_raw(&self.segment, params)));
            }
            for hash in &audit.gone_segments {
                let params: [&(dyn ToSql + Sync); 3] = [&audit.tenant, &audit.chat_id, hash];
                writes.push(Box::pin(self.client.execute_raw(&self.delete_segment, params)));
            }
        }
        let written = try_join_all(writes).await?;
        if generations.iter().any(|&at| written[at] == 0) {
            self.client.batch_execute("ROLLBACK").await?; // a generation id another chat uses
            return Ok(Written::Declined);
        }
        commit_sent.set(true);
        self.client.batch_execute("COMMIT").await?;
        Ok(Written::Stored)
    }
}

impl GroupStore for GroupWriter {
    type Failure = Failure;

    fn write(&mut self, records: &[Record]) -> Result<Written, Failure> {
        let deadline = match self.start() {
            Ok(deadline) => deadline,
            Err(unconnected) => return unconnected,
        };
        let session = self.session.as_ref().expect("connected");
        let commit_sent = Cell::new(false);
        let work = session.write(&self.statements, records, &commit_sent);
        let done = self.within(deadline, work);
        let closed = session.client.is_closed();
        match done {
            Some(Ok(written)) => Ok(written),
            None => Err(self.timed_out()),
            Some(Err(e)) if closed && commit_sent.get() => {
                self.dropped();
                Err(Failure::Unavailable(format!(
                    "the connection to PostgreSQL broke with the group's COMMIT sent: {e}"
                )))
            }
            Some(Err(_)) if closed => {
                self.dropped(); // nothing committed: the store's path finds out whether it is down
                Ok(Written::Declined)
            }
            Some(Err(_)) => {
                // An error of the database (the transaction is aborted): rolled back, and the
                // store's path runs the group again, retrying or saying which record failed.
                let rolled_back =
                    matches!(self.within(deadline, session.client.batch_execute("ROLLBACK")), Some(Ok(())));
                if !rolled_back {
                    self.dropped();
                }
                Ok(Written::Declined)
            }
        }
    }

    fn read(&mut self, reads: &[Vec<Value>]) -> Result<Option<Vec<Row>>, Failure> {
        let deadline = match self.start() {
            Ok(deadline) => deadline,
            Err(unconnected) => return unconnected.map(|_| None),
        };
        let session = self.session.as_ref().expect("connected");
        let done = self.within(deadline, session.read(&self.audit_read, reads));
        let closed = session.client.is_closed();
        match done {
            Some(Ok(rows)) => Ok(Some(rows)),
            None => Err(self.timed_out()),
            Some(Err(_)) => {
                if closed {
                    self.dropped();
                }
                Ok(None) // the store's path reads them, and says why not
            }
        }
    }

    fn panicked() -> Failure {
        Failure::Internal("the core's group writer panicked".into())
    }

    fn notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }
}
