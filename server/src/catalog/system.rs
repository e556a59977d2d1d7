//! System tables in the schema `weir_catalog`: the cluster as SQL sees it,
//! read fresh on every query (what Flink's web UI shows, and RisingWave's
//! `rw_catalog` tables).
//!
//! - `task_managers`: every registered TaskManager (and those lost lately):
//!   address, hardware, slots total and free, registration and last
//!   heartbeat, state;
//! - `slots`: every slot, its share of managed memory and how much of it
//!   its operators' caches and its RocksDB instances use (as of the
//!   TaskManager's last heartbeat), free or with the jobs and subtasks it
//!   holds;
//! - `state`: per view, subtask and stateful operator, its state backend,
//!   the keys and bytes it holds in memory, the bytes of its table on
//!   disk, and its cache's hits, misses and evictions, as of the
//!   subtask's latest checkpoint;
//! - `jobs`: every view's job with its state, attempt, restarts and last
//!   completed checkpoint;
//! - `subtasks`: every subtask with its ExecutionState and slot;
//! - `checkpoints`: each job's recent checkpoints (Flink's checkpoint
//!   history): trigger time, duration, alignment time, bytes of state
//!   written, acknowledgements, and IN_PROGRESS / COMPLETED / FAILED /
//!   ABORTED with the cause;
//! - `source_errors`: per job and connector source it reads, the records
//!   that could not be decoded and were skipped, as of the job's latest
//!   completed checkpoint (Flink's `numRecordsInErrors`), the last error
//!   and the dead-letter table that keeps them.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use cluster::gateway::ResourceManagerGateway;
use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::error::Result as DfResult;

use crate::catalog::view::CatalogView;
use crate::sql::types::UTC;

/// The schema holding the system tables.
pub const SCHEMA: &str = "weir_catalog";

const TABLES: [&str; 10] = [
    "state",
    "late_rows",
    "restore_errors",
    "source_errors",
    "task_managers",
    "slots",
    "jobs",
    "subtasks",
    "checkpoints",
    "savepoints",
];

/// `weir_catalog` for one statement.
#[derive(Debug)]
pub struct SystemSchema {
    pub db: Arc<dyn CatalogView>,
}

enum Col {
    Text(Vec<Option<String>>),
    Int(Vec<Option<i64>>),
    Float(Vec<Option<f64>>),
    Time(Vec<Option<i64>>),
}

impl Col {
    fn field(&self, name: &str) -> Field {
        let t = match self {
            Col::Text(_) => DataType::Utf8,
            Col::Int(_) => DataType::Int64,
            Col::Float(_) => DataType::Float64,
            Col::Time(_) => DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from(UTC))),
        };
        Field::new(name, t, true)
    }

    fn array(self) -> ArrayRef {
        match self {
            Col::Text(v) => Arc::new(StringArray::from(v)),
            Col::Int(v) => Arc::new(Int64Array::from(v)),
            Col::Float(v) => Arc::new(Float64Array::from(v)),
            Col::Time(v) => Arc::new(TimestampMicrosecondArray::from(v).with_timezone(UTC)),
        }
    }
}

fn micros(t: SystemTime) -> Option<i64> {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_micros() as i64)
}

fn table(columns: Vec<(&str, Col)>) -> DfResult<Arc<dyn TableProvider>> {
    let schema = Arc::new(Schema::new(
        columns.iter().map(|(n, c)| c.field(n)).collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, c)| c.array()).collect(),
    )?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

impl SystemSchema {
    fn view_name(&self, job: u64) -> Option<String> {
        self.db
            .catalog()
            .get(job)
            .map(|e| e.qualified().to_string())
    }

    fn task_managers(&self) -> DfResult<Arc<dyn TableProvider>> {
        let tms = self.db.cluster().resource_manager.task_managers();
        table(vec![
            (
                "resource_id",
                Col::Text(tms.iter().map(|t| Some(t.resource_id.clone())).collect()),
            ),
            (
                "address",
                Col::Text(tms.iter().map(|t| Some(t.address.clone())).collect()),
            ),
            (
                "cpu_cores",
                Col::Int(tms.iter().map(|t| Some(t.cpu_cores as i64)).collect()),
            ),
            (
                "managed_memory_bytes",
                Col::Int(
                    tms.iter()
                        .map(|t| Some(t.managed_memory_bytes as i64))
                        .collect(),
                ),
            ),
            (
                "slots_total",
                Col::Int(tms.iter().map(|t| Some(t.slots_total as i64)).collect()),
            ),
            (
                "slots_free",
                Col::Int(tms.iter().map(|t| Some(t.slots_free as i64)).collect()),
            ),
            (
                "registered_at",
                Col::Time(tms.iter().map(|t| micros(t.registered_at)).collect()),
            ),
            (
                "last_heartbeat",
                Col::Time(tms.iter().map(|t| micros(t.last_heartbeat)).collect()),
            ),
            (
                "state",
                Col::Text(tms.iter().map(|t| Some(t.state.to_string())).collect()),
            ),
        ])
    }

    fn slots(&self) -> DfResult<Arc<dyn TableProvider>> {
        let tms = self.db.cluster().resource_manager.task_managers();
        let jobs = self.db.cluster().job_manager.jobs();
        let (mut tm, mut index, mut memory, mut state, mut job, mut view, mut subtasks) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut operators, mut rocksdb) = (vec![], vec![]);
        for t in tms.iter().filter(|t| t.state == "REGISTERED") {
            for (i, held) in t.slot_jobs.iter().enumerate() {
                let slot = format!("{}#{i}", t.resource_id);
                let rows: Vec<Option<u64>> = if held.is_empty() {
                    vec![None]
                } else {
                    held.iter().map(|j| Some(*j)).collect()
                };
                for j in rows {
                    tm.push(Some(t.resource_id.clone()));
                    index.push(Some(i as i64));
                    memory.push(Some((t.managed_memory_bytes / t.slots_total.max(1)) as i64));
                    let used = t.slot_memory_used.get(i).copied().unwrap_or_default();
                    operators.push(Some(used.operators as i64));
                    rocksdb.push(Some(used.rocksdb as i64));
                    state.push(Some(
                        if j.is_some() { "ALLOCATED" } else { "FREE" }.to_string(),
                    ));
                    job.push(j.map(|j| j as i64));
                    view.push(j.and_then(|j| self.view_name(j)));
                    subtasks.push(j.map(|j| {
                        jobs.iter()
                            .filter(|s| s.job == j)
                            .flat_map(|s| s.subtasks.iter())
                            .filter(|(_, _, s, _)| *s == slot)
                            .map(|(v, i, _, _)| format!("{v}#{i}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }));
                }
            }
        }
        table(vec![
            ("task_manager", Col::Text(tm)),
            ("slot", Col::Int(index)),
            ("managed_memory_bytes", Col::Int(memory)),
            ("operator_memory_used", Col::Int(operators)),
            ("rocksdb_memory_used", Col::Int(rocksdb)),
            ("state", Col::Text(state)),
            ("job", Col::Int(job)),
            ("view", Col::Text(view)),
            ("subtasks", Col::Text(subtasks)),
        ])
    }

    fn jobs(&self) -> DfResult<Arc<dyn TableProvider>> {
        let jobs = self.db.cluster().job_manager.jobs();
        table(vec![
            (
                "job",
                Col::Int(jobs.iter().map(|j| Some(j.job as i64)).collect()),
            ),
            (
                "view",
                Col::Text(jobs.iter().map(|j| self.view_name(j.job)).collect()),
            ),
            (
                "state",
                Col::Text(jobs.iter().map(|j| Some(j.state.clone())).collect()),
            ),
            (
                "attempt",
                Col::Int(jobs.iter().map(|j| Some(j.attempt as i64)).collect()),
            ),
            (
                "restarts",
                Col::Int(jobs.iter().map(|j| Some(j.restarts as i64)).collect()),
            ),
            (
                "last_checkpoint",
                Col::Int(
                    jobs.iter()
                        .map(|j| Some(j.last_checkpoint as i64))
                        .collect(),
                ),
            ),
            (
                "restored_checkpoint",
                Col::Int(
                    jobs.iter()
                        .map(|j| j.restored_checkpoint.map(|c| c as i64))
                        .collect(),
                ),
            ),
        ])
    }

    /// One row per view's job in each savepoint.
    fn savepoints(&self) -> DfResult<Arc<dyn TableProvider>> {
        let all: Vec<_> = self
            .db
            .cluster()
            .job_manager
            .savepoints()
            .into_iter()
            .flat_map(|s| {
                s.jobs
                    .iter()
                    .map(|j| (s.name.clone(), s.created_at_ms, j.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        table(vec![
            (
                "name",
                Col::Text(all.iter().map(|(n, _, _)| Some(n.clone())).collect()),
            ),
            (
                "job",
                Col::Int(all.iter().map(|(_, _, j)| Some(j.job as i64)).collect()),
            ),
            (
                "view",
                Col::Text(all.iter().map(|(_, _, j)| self.view_name(j.job)).collect()),
            ),
            (
                "checkpoint",
                Col::Int(all.iter().map(|(_, _, j)| Some(j.id as i64)).collect()),
            ),
            (
                "created_at",
                Col::Time(
                    all.iter()
                        .map(|(_, ms, _)| Some(*ms as i64 * 1000))
                        .collect(),
                ),
            ),
            (
                "bytes",
                Col::Int(
                    all.iter()
                        .map(|(_, _, j)| Some(j.full_size() as i64))
                        .collect(),
                ),
            ),
            (
                "format_version",
                Col::Int(all.iter().map(|(_, _, j)| Some(j.version as i64)).collect()),
            ),
        ])
    }

    fn checkpoints(&self) -> DfResult<Arc<dyn TableProvider>> {
        let all = self.db.cluster().job_manager.checkpoints();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        table(vec![
            (
                "job",
                Col::Int(all.iter().map(|(j, _)| Some(*j as i64)).collect()),
            ),
            (
                "view",
                Col::Text(all.iter().map(|(j, _)| self.view_name(*j)).collect()),
            ),
            (
                "id",
                Col::Int(all.iter().map(|(_, c)| Some(c.id as i64)).collect()),
            ),
            (
                "kind",
                Col::Text(
                    all.iter()
                        .map(|(_, c)| Some(c.kind.as_str().to_string()))
                        .collect(),
                ),
            ),
            (
                "state",
                Col::Text(
                    all.iter()
                        .map(|(_, c)| Some(c.status.to_string()))
                        .collect(),
                ),
            ),
            (
                "triggered_at",
                Col::Time(all.iter().map(|(_, c)| micros(c.triggered_at)).collect()),
            ),
            (
                "duration_ms",
                Col::Float(all.iter().map(|(_, c)| c.duration.map(ms)).collect()),
            ),
            (
                "alignment_ms",
                Col::Float(all.iter().map(|(_, c)| Some(ms(c.alignment))).collect()),
            ),
            (
                "full_bytes",
                Col::Int(all.iter().map(|(_, c)| Some(c.full_bytes as i64)).collect()),
            ),
            (
                "incremental_bytes",
                Col::Int(
                    all.iter()
                        .map(|(_, c)| Some(c.incremental_bytes as i64))
                        .collect(),
                ),
            ),
            (
                "acknowledged",
                Col::Int(
                    all.iter()
                        .map(|(_, c)| Some(c.acknowledged as i64))
                        .collect(),
                ),
            ),
            (
                "tasks",
                Col::Int(all.iter().map(|(_, c)| Some(c.tasks as i64)).collect()),
            ),
            (
                "cause",
                Col::Text(all.iter().map(|(_, c)| c.cause.clone()).collect()),
            ),
        ])
    }

    /// Rows each `EMIT ON WINDOW CLOSE` view dropped for arriving after
    /// their window had closed, per window, as of the view's latest
    /// checkpoint (so a restart neither loses nor doubles them).
    async fn late_rows(&self) -> DfResult<Arc<dyn TableProvider>> {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "window_end",
            executor::operators::late_rows_type(),
            true,
        )]));
        let (mut view, mut window_end, mut rows) = (vec![], vec![], vec![]);
        for entry in self.db.catalog().all() {
            let name = entry.qualified().to_string();
            let crate::catalog::Entry::MaterializedView {
                id,
                emit_on_window_close: true,
                ..
            } = entry
            else {
                continue;
            };
            let table = planner::late_rows_state_table(id);
            let batches = match self
                .db
                .cluster()
                .job_manager
                .read_view(id, table, schema.clone())
                .await
            {
                Ok(b) => b,
                // Dropped meanwhile.
                Err(cluster::ClusterError::UnknownJob(_)) => continue,
                Err(e) => return Err(datafusion::error::DataFusionError::External(Box::new(e))),
            };
            let mut per_window: std::collections::BTreeMap<i64, i64> = Default::default();
            for b in &batches {
                let ends = executor::expr::timestamp_micros(b.column(0))
                    .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
                for end in ends.iter().flatten() {
                    *per_window.entry(end).or_default() += 1;
                }
            }
            for (end, n) in per_window {
                view.push(Some(name.clone()));
                window_end.push(Some(end));
                rows.push(Some(n));
            }
        }
        table(vec![
            ("view", Col::Text(view)),
            ("window_end", Col::Time(window_end)),
            ("rows", Col::Int(rows)),
        ])
    }

    /// Per job and connector source: the records skipped because they
    /// could not be decoded, as of the job's latest completed checkpoint
    /// (each counted once, across restarts).
    fn source_errors(&self) -> DfResult<Arc<dyn TableProvider>> {
        let jobs = &self.db.cluster().job_manager;
        let name = |id: u64| self.db.catalog().get(id).map(|e| e.qualified().to_string());
        let (mut job, mut view, mut source, mut skipped, mut error, mut at, mut dead) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for j in jobs.jobs() {
            let Ok(completed) = jobs.completed_checkpoints(j.job) else {
                continue;
            };
            let errors = completed.borrow().decode_errors.clone();
            for (id, e) in errors {
                job.push(Some(j.job as i64));
                view.push(name(j.job));
                source.push(name(id));
                skipped.push(Some(e.records as i64));
                error.push(e.last.as_ref().map(|(_, m)| m.clone()));
                at.push(e.last.as_ref().map(|(t, _)| *t));
                dead.push(
                    self.db
                        .catalog()
                        .get(id)
                        .and_then(|e| match e {
                            crate::catalog::Entry::Source { connector, .. } => {
                                connector.dead_letter_table
                            }
                            crate::catalog::Entry::Table {
                                ingest: Some(i), ..
                            } => i.connector.dead_letter_table,
                            _ => None,
                        })
                        .and_then(name),
                );
            }
        }
        table(vec![
            ("job", Col::Int(job)),
            ("name", Col::Text(view)),
            ("source", Col::Text(source)),
            ("skipped", Col::Int(skipped)),
            ("last_error", Col::Text(error)),
            ("last_error_at", Col::Time(at)),
            ("dead_letter_table", Col::Text(dead)),
        ])
    }

    /// Each stateful operator's state per subtask (see the module docs).
    fn state(&self) -> DfResult<Arc<dyn TableProvider>> {
        let mut all = self.db.cluster().job_manager.state_stats();
        all.sort_by_key(|a| (a.0, a.1, a.2, a.3.table));
        let int = |f: &dyn Fn(&executor::state::OperatorStateStats) -> u64| {
            Col::Int(all.iter().map(|(.., s)| Some(f(s) as i64)).collect())
        };
        table(vec![
            (
                "job",
                Col::Int(all.iter().map(|(j, ..)| Some(*j as i64)).collect()),
            ),
            (
                "name",
                Col::Text(all.iter().map(|(j, ..)| self.view_name(*j)).collect()),
            ),
            (
                "vertex",
                Col::Int(all.iter().map(|(_, v, ..)| Some(*v as i64)).collect()),
            ),
            (
                "subtask",
                Col::Int(all.iter().map(|(_, _, s, _)| Some(*s as i64)).collect()),
            ),
            (
                "operator",
                Col::Text(all.iter().map(|(.., s)| Some(s.operator.clone())).collect()),
            ),
            ("state_table", int(&|s| s.table)),
            (
                "backend",
                Col::Text(all.iter().map(|(.., s)| Some(s.backend.clone())).collect()),
            ),
            (
                "keys",
                Col::Int(all.iter().map(|(.., s)| s.keys.map(|k| k as i64)).collect()),
            ),
            ("keys_in_memory", int(&|s| s.keys_in_memory)),
            ("bytes_in_memory", int(&|s| s.bytes_in_memory)),
            ("bytes_on_disk", int(&|s| s.bytes_on_disk)),
            ("cache_hits", int(&|s| s.cache_hits)),
            ("cache_misses", int(&|s| s.cache_misses)),
            (
                "cache_hit_rate",
                Col::Float(
                    all.iter()
                        .map(|(.., s)| {
                            let touches = s.cache_hits + s.cache_misses;
                            (touches > 0).then(|| s.cache_hits as f64 / touches as f64)
                        })
                        .collect(),
                ),
            ),
            ("evictions", int(&|s| s.evictions)),
        ])
    }

    /// The objects the server could not restore when it started, and why;
    /// each stays until it is dropped.
    fn restore_errors(&self) -> DfResult<Arc<dyn TableProvider>> {
        let all = self.db.restore_errors().all();
        table(vec![
            (
                "id",
                Col::Int(all.iter().map(|(id, _)| Some(*id as i64)).collect()),
            ),
            (
                "name",
                Col::Text(all.iter().map(|(_, e)| e.name.clone()).collect()),
            ),
            (
                "kind",
                Col::Text(all.iter().map(|(_, e)| Some(e.kind.to_string())).collect()),
            ),
            (
                "error",
                Col::Text(all.iter().map(|(_, e)| Some(e.error.clone())).collect()),
            ),
            (
                "at",
                Col::Time(all.iter().map(|(_, e)| micros(e.at)).collect()),
            ),
        ])
    }

    fn subtasks(&self) -> DfResult<Arc<dyn TableProvider>> {
        let jobs = self.db.cluster().job_manager.jobs();
        let (mut job, mut view, mut vertex, mut subtask, mut state, mut slot, mut tm) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for j in &jobs {
            for (v, i, s, st) in &j.subtasks {
                job.push(Some(j.job as i64));
                view.push(self.view_name(j.job));
                vertex.push(Some(v.clone()));
                subtask.push(Some(*i as i64));
                state.push(Some(st.to_string()));
                slot.push(Some(s.clone()));
                tm.push(s.rsplit_once('#').map(|(t, _)| t.to_string()));
            }
        }
        table(vec![
            ("job", Col::Int(job)),
            ("view", Col::Text(view)),
            ("vertex", Col::Text(vertex)),
            ("subtask", Col::Int(subtask)),
            ("state", Col::Text(state)),
            ("slot", Col::Text(slot)),
            ("task_manager", Col::Text(tm)),
        ])
    }
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn table_names(&self) -> Vec<String> {
        TABLES.iter().map(|t| t.to_string()).collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        Ok(Some(match name {
            "task_managers" => self.task_managers()?,
            "slots" => self.slots()?,
            "state" => self.state()?,
            "jobs" => self.jobs()?,
            "subtasks" => self.subtasks()?,
            "checkpoints" => self.checkpoints()?,
            "savepoints" => self.savepoints()?,
            "late_rows" => self.late_rows().await?,
            "source_errors" => self.source_errors()?,
            "restore_errors" => self.restore_errors()?,
            _ => return Ok(None),
        }))
    }

    fn table_exist(&self, name: &str) -> bool {
        TABLES.contains(&name)
    }
}
