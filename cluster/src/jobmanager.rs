//! The JobManager's Dispatcher: receives jobs from the SQL front end, starts
//! a JobMaster for each, fails over the jobs of lost TaskManagers, and
//! answers questions about all of them (`FLUSH`, EXPLAIN's slot preview,
//! job listings, view scans). It owns the checkpoint storage.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use planner::execution_graph::{ExecutionGraph, ExecutionState};
use planner::job_graph::JobGraph;
use storage::checkpoint_storage::{CheckpointMetadata, CheckpointStorage, FORMAT_VERSION};
use storage::savepoint::SavepointMetadata;
use tokio::sync::watch;

use crate::checkpoint::CompletedCheckpoint;
use crate::config::ClusterConfig;
use crate::gateway::ResourceManagerGateway;
use crate::jobmaster::{JobMaster, JobState};
use crate::{ClusterError, ResourceManager, Result};

/// A job as `SHOW JOBS` lists it.
#[derive(Debug, Clone)]
pub struct JobStatus {
    pub job: u64,
    pub state: String,
    pub last_checkpoint: u64,
    /// The checkpoint the current deployment restored from (Flink's
    /// "latest restore"); `None` for a fresh start.
    pub restored_checkpoint: Option<u64>,
    /// Deployment attempt (0 for the first) and restarts so far.
    pub attempt: u64,
    pub restarts: u32,
    /// (vertex name, subtask, slot, state).
    pub subtasks: Vec<(String, usize, String, ExecutionState)>,
}

/// The tables a job's sources read and where its oldest retained
/// checkpoint left them (`None` before its first checkpoint).
#[derive(Debug, Clone)]
pub struct JobSources {
    pub tables: Vec<u64>,
    pub positions: Option<HashMap<u64, u64>>,
}

/// A job that reads views (see [`JobManager::view_sources`]).
pub(crate) struct ViewReader {
    pub(crate) job: u64,
    pub(crate) views: Vec<u64>,
    /// The epochs of its oldest retained checkpoint, by view.
    pub(crate) positions: Option<HashMap<u64, u64>>,
}

/// How long a `FLUSH` waits, after a checkpoint at which a source was
/// behind, before it triggers the next. Longer than a connector's read
/// waits at the end of a split (a Kafka fetch waits 100 ms), so that the
/// next barrier finds news fresher than the previous barrier.
const BEHIND_PAUSE: std::time::Duration = std::time::Duration::from_millis(150);

/// The Dispatcher.
pub struct JobManager {
    rm: Arc<dyn ResourceManagerGateway>,
    /// Every job's completed checkpoints.
    storage: Arc<CheckpointStorage>,
    /// Local scratch space for reading checkpoints.
    scratch: std::path::PathBuf,
    config: ClusterConfig,
    /// The database's tables, whose commits barriers follow.
    tables: Arc<storage::table::TableStore>,
    jobs: Mutex<BTreeMap<u64, Arc<JobMaster>>>,
    /// The epochs of views' changelogs that jobs reading them need.
    pub(crate) holds: Arc<crate::view_log::ChangelogHolds>,
    /// Every complete savepoint in storage, by name.
    savepoints: Mutex<BTreeMap<String, SavepointMetadata>>,
}

impl std::fmt::Debug for JobManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobManager").finish_non_exhaustive()
    }
}

fn poisoned() -> ClusterError {
    ClusterError::Internal("job manager lock poisoned".into())
}

impl JobManager {
    /// The Dispatcher over `rm`, failing over the jobs of every TaskManager
    /// it loses.
    pub fn start(
        rm: Arc<ResourceManager>,
        storage: Arc<CheckpointStorage>,
        scratch: std::path::PathBuf,
        config: ClusterConfig,
        tables: Arc<storage::table::TableStore>,
    ) -> Arc<Self> {
        let mut lost = rm.lost_task_managers();
        let jm = Arc::new(Self {
            rm,
            storage,
            scratch,
            config,
            tables,
            jobs: Mutex::new(BTreeMap::new()),
            holds: Default::default(),
            savepoints: Mutex::new(BTreeMap::new()),
        });
        let weak: Weak<Self> = Arc::downgrade(&jm);
        tokio::spawn(async move {
            loop {
                let tm = match lost.recv().await {
                    Ok(tm) => tm,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                };
                let Some(me) = weak.upgrade() else { return };
                let jobs: Vec<_> = match me.jobs.lock() {
                    Ok(j) => j.values().cloned().collect(),
                    Err(_) => return,
                };
                for job in jobs.into_iter().filter(|j| j.uses_task_manager(&tm)) {
                    tokio::spawn(job.failover(executor::Failure::internal(format!(
                        "task manager {tm} lost"
                    ))));
                }
            }
        });
        jm
    }

    pub fn resource_manager(&self) -> &Arc<dyn ResourceManagerGateway> {
        &self.rm
    }

    /// A JobMaster for `job`, known to the Dispatcher (so TaskManagers can
    /// reach it) before it asks for slots, with its retained checkpoints
    /// read from checkpoint storage.
    async fn register(&self, job: u64, graph: JobGraph, floor: u64) -> Result<Arc<JobMaster>> {
        let jm = JobMaster::new(
            job,
            graph,
            self.rm.clone(),
            self.storage.clone(),
            self.scratch.clone(),
            self.config.clone(),
            crate::jobmaster::BarrierStamps {
                tables: self.tables.clone(),
                holds: self.holds.clone(),
            },
        )?;
        jm.load_checkpoints(floor).await?;
        self.jobs
            .lock()
            .map_err(|_| poisoned())?
            .insert(job, jm.clone());
        Ok(jm)
    }

    /// Starts a job; returns once its subtasks are deployed, or fails
    /// (with SQLSTATE 53000 when there are not enough slots).
    pub async fn submit_job(&self, job: u64, graph: JobGraph) -> Result<()> {
        let jm = self.register(job, graph, 0).await?;
        if let Err(e) = jm.launch().await {
            self.jobs.lock().map_err(|_| poisoned())?.remove(&job);
            let _ = jm.stop(false).await;
            return Err(e);
        }
        Ok(())
    }

    /// Restarts a job from its latest completed checkpoint without waiting.
    /// Until TaskManagers bring enough slots (they may still be registering
    /// after a JobManager restart) it waits, however long that takes; any
    /// other failure goes to the restart strategy.
    pub async fn recover_job(&self, job: u64, graph: JobGraph) -> Result<()> {
        let jm = self.register(job, graph, 0).await?;
        tokio::spawn(async move {
            loop {
                match jm.launch().await {
                    Ok(()) => return,
                    Err(ClusterError::NotEnoughSlots { needed, total, .. })
                        if jm.state() == JobState::Created =>
                    {
                        tracing::info!(
                            job,
                            needed,
                            total,
                            "waiting for task managers to bring slots"
                        );
                    }
                    Err(e) => {
                        if jm.state() == JobState::Created {
                            jm.failover(e.failure()).await;
                        }
                        return;
                    }
                }
            }
        });
        Ok(())
    }

    /// A view's rows at its job's latest completed checkpoint.
    pub async fn read_view(
        &self,
        job: u64,
        state_table: u64,
        schema: SchemaRef,
    ) -> Result<Vec<RecordBatch>> {
        let jm = self.jobs.lock().map_err(|_| poisoned())?.get(&job).cloned();
        match jm {
            Some(jm) => jm.read_view(state_table, schema).await,
            None => Err(ClusterError::UnknownJob(job)),
        }
    }

    /// [`JobManager::read_view`] as a stream of batches, read a page at a
    /// time as it is polled: what `SELECT` reads.
    pub async fn read_view_stream(
        &self,
        job: u64,
        state_table: u64,
        schema: SchemaRef,
    ) -> Result<crate::gateway::ViewStream> {
        Ok(self
            .master(job)?
            .read_view_stream(state_table, schema)
            .await?
            .1)
    }

    /// [`JobManager::read_view_stream`], with the id of the checkpoint
    /// read (0 before the first).
    pub async fn read_view_stream_at(
        &self,
        job: u64,
        state_table: u64,
        schema: SchemaRef,
    ) -> Result<(u64, crate::gateway::ViewStream)> {
        self.master(job)?
            .read_view_stream(state_table, schema)
            .await
    }

    /// A view's changes after epoch `since`, from its changelog table at
    /// the job's latest completed checkpoint, with that checkpoint's id.
    pub async fn read_changes(
        &self,
        job: u64,
        changelog_table: u64,
        schema: SchemaRef,
        since: u64,
    ) -> Result<(u64, crate::gateway::ChangeStream)> {
        self.master(job)?
            .read_changes(changelog_table, schema, since)
            .await
    }

    /// Follows `job`'s completed checkpoints.
    pub fn completed_checkpoints(&self, job: u64) -> Result<watch::Receiver<CompletedCheckpoint>> {
        Ok(self.master(job)?.completed())
    }

    pub(crate) fn master(&self, job: u64) -> Result<Arc<JobMaster>> {
        self.jobs
            .lock()
            .map_err(|_| poisoned())?
            .get(&job)
            .cloned()
            .ok_or(ClusterError::UnknownJob(job))
    }

    /// Restarts `job` with `graph` — the same operators at other
    /// parallelisms: it takes a checkpoint, stops the job, and starts it
    /// again from that checkpoint, each new subtask restoring the key groups
    /// it now owns. If the new graph cannot be deployed (not enough slots)
    /// the job goes back to its old graph. Returns once the rescaled job has
    /// completed a checkpoint.
    pub async fn rescale(&self, job: u64, graph: JobGraph) -> Result<()> {
        let old = self.job_master(job).ok_or(ClusterError::UnknownJob(job))?;
        // A job that failed for good starts again from its latest retained
        // checkpoint; a running one takes a checkpoint to start from.
        if !matches!(old.state(), JobState::Failed(_)) {
            self.checkpoint_now(job).await?;
        }
        // Until the new JobMaster replaces it, reads of the stopped job go
        // to its retained checkpoints.
        old.stop(false).await?;
        let attempt = old.attempts().0 + 1;
        let jm = self.register(job, graph, 0).await?;
        jm.start_at_attempt(attempt);
        if let Err(e) = jm.launch().await {
            tracing::warn!(job, error = %e, "rescaled job could not start; back to its old parallelism");
            let _ = jm.stop(false).await;
            let back = self.register(job, old.job_graph().clone(), 0).await?;
            back.start_at_attempt(attempt + 1);
            back.launch().await?;
            return Err(e);
        }
        self.checkpoint_now(job).await
    }

    /// The errors counted in `job` at its latest completed checkpoint: each
    /// message of a row whose expression fails, once per such row
    /// (`executor::errors`).
    pub async fn read_errors(&self, job: u64) -> Result<Vec<executor::Failure>> {
        let jm = self.master(job)?;
        let mut out = Vec::new();
        for table in jm.job_graph().error_tables() {
            for batch in jm
                .read_view(table, executor::errors::error_schema())
                .await?
            {
                out.extend(executor::errors::failures(&batch));
            }
        }
        Ok(out)
    }

    /// Whether `job` failed for good (its restart strategy gave up).
    pub fn has_failed(&self, job: u64) -> bool {
        self.job_master(job)
            .is_some_and(|jm| matches!(jm.state(), JobState::Failed(_)))
    }

    /// Reads the savepoints in checkpoint storage; an incomplete or damaged
    /// one is left alone and not listed.
    pub async fn load_savepoints(&self) -> Result<()> {
        let mut found = BTreeMap::new();
        for name in self.storage.savepoint_names().await? {
            match self.storage.read_savepoint(&name).await {
                Ok(meta) => {
                    found.insert(name, meta);
                }
                Err(e) => {
                    tracing::warn!(savepoint = %name, error = %e, "savepoint not usable; ignored")
                }
            }
        }
        *self.savepoints.lock().map_err(|_| poisoned())? = found;
        Ok(())
    }

    /// Every savepoint, by name.
    pub fn savepoints(&self) -> Vec<SavepointMetadata> {
        self.savepoints
            .lock()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Takes savepoint `name` of `jobs`: for each, a checkpoint now,
    /// rewritten in the canonical format under `savepoints/<name>/`; the
    /// metadata last.
    pub async fn create_savepoint(&self, name: &str, jobs: &[u64]) -> Result<SavepointMetadata> {
        if self
            .savepoints
            .lock()
            .map_err(|_| poisoned())?
            .contains_key(name)
            || self
                .storage
                .savepoint_names()
                .await?
                .iter()
                .any(|n| n == name)
        {
            return Err(ClusterError::SavepointExists(name.to_string()));
        }
        let mut parts = Vec::new();
        for job in jobs {
            match self.savepoint_job(name, *job).await {
                Ok(part) => parts.push(part),
                Err(e) => {
                    let _ = self.storage.drop_savepoint(name).await;
                    return Err(e);
                }
            }
        }
        let meta = SavepointMetadata {
            version: FORMAT_VERSION,
            name: name.to_string(),
            created_at_ms: now_ms(),
            jobs: parts,
        };
        self.storage.write_savepoint(&meta).await?;
        self.savepoints
            .lock()
            .map_err(|_| poisoned())?
            .insert(name.to_string(), meta.clone());
        tracing::info!(savepoint = name, jobs = ?jobs, bytes = meta.size(), "savepoint taken");
        Ok(meta)
    }

    async fn savepoint_job(&self, name: &str, job: u64) -> Result<CheckpointMetadata> {
        self.checkpoint_now(job).await?;
        let jm = self.job_master(job).ok_or(ClusterError::UnknownJob(job))?;
        let latest = jm.pin_latest()?;
        let scratch = self.scratch.join(format!("savepoint-{name}-{job}"));
        let part = self.storage.savepoint_job(name, &latest, &scratch).await;
        jm.unpin(latest.id);
        let _ = std::fs::remove_dir_all(&scratch);
        Ok(part?)
    }

    /// Deletes savepoint `name`.
    pub async fn drop_savepoint(&self, name: &str) -> Result<()> {
        if self
            .savepoints
            .lock()
            .map_err(|_| poisoned())?
            .remove(name)
            .is_none()
        {
            return Err(ClusterError::UnknownSavepoint(name.to_string()));
        }
        self.storage.drop_savepoint(name).await?;
        Ok(())
    }

    /// Restarts `jobs` (all the savepoint's jobs that still exist, when
    /// `None`) from savepoint `name`. Returns the jobs restored.
    pub async fn restore_savepoint(&self, name: &str, jobs: Option<&[u64]>) -> Result<Vec<u64>> {
        let meta = self
            .savepoints
            .lock()
            .map_err(|_| poisoned())?
            .get(name)
            .cloned()
            .ok_or_else(|| ClusterError::UnknownSavepoint(name.to_string()))?;
        let parts: Vec<&CheckpointMetadata> = match jobs {
            Some(jobs) => {
                let mut parts = Vec::new();
                for job in jobs {
                    parts.push(meta.jobs.iter().find(|p| p.job == *job).ok_or_else(|| {
                        ClusterError::NotInSavepoint {
                            savepoint: name.to_string(),
                            job: *job,
                        }
                    })?);
                }
                parts
            }
            None => meta
                .jobs
                .iter()
                .filter(|p| self.job_master(p.job).is_some())
                .collect(),
        };
        // A view read by other views' jobs goes back in time; what they
        // read of it after the savepoint would be replayed to them a second
        // time. They (and the views over them) start again from the
        // restored view's rows instead.
        let restored: BTreeSet<u64> = parts.iter().map(|p| p.job).collect();
        let readers = self.readers_of(&restored);
        for part in parts.iter().filter(|p| !readers.contains(&p.job)) {
            self.restore_job(part).await?;
        }
        for job in &readers {
            self.restart_fresh(*job).await?;
        }
        Ok(parts.iter().map(|p| p.job).collect())
    }

    /// The jobs that read one of `views`, directly or through other views,
    /// in id order (a view is older than the views over it).
    fn readers_of(&self, views: &BTreeSet<u64>) -> BTreeSet<u64> {
        let reads: Vec<(u64, Vec<u64>)> = match self.jobs.lock() {
            Ok(jobs) => jobs.values().map(|j| (j.job, j.source_views())).collect(),
            Err(_) => return BTreeSet::new(),
        };
        let mut readers = BTreeSet::new();
        loop {
            let before = readers.len();
            for (job, read) in &reads {
                if read
                    .iter()
                    .any(|v| views.contains(v) || readers.contains(v))
                {
                    readers.insert(*job);
                }
            }
            if readers.len() == before {
                return readers;
            }
        }
    }

    /// Stops `job` and starts it again with no state — a fresh backfill —
    /// its checkpoint ids going on after every one it used.
    async fn restart_fresh(&self, job: u64) -> Result<()> {
        let old = self.job_master(job).ok_or(ClusterError::UnknownJob(job))?;
        old.stop(false).await?;
        let dirs = self.storage.checkpoint_dirs(job).await?;
        // Every checkpoint is before the floor, so none is kept.
        let floor = dirs
            .last()
            .map_or(1, |(id, _)| id + 1)
            .max(old.next_checkpoint_id());
        let attempt = old.attempts().0 + 1;
        let jm = self.register(job, old.job_graph().clone(), floor).await?;
        jm.start_at_attempt(attempt);
        jm.launch().await?;
        tracing::info!(
            job,
            "job started again from nothing: a view it reads was restored"
        );
        self.checkpoint_now(job).await
    }

    /// Stops `part.job`, makes `part` its newest checkpoint (the others go)
    /// and starts it from there.
    async fn restore_job(&self, part: &CheckpointMetadata) -> Result<()> {
        let job = part.job;
        let old = self.job_master(job).ok_or(ClusterError::UnknownJob(job))?;
        old.stop(false).await?;
        let dirs = self.storage.checkpoint_dirs(job).await?;
        let id = dirs.last().map_or(1, |(id, _)| id + 1);
        self.storage
            .checkpoint_from_savepoint(part, id, now_ms())
            .await?;
        let attempt = old.attempts().0 + 1;
        let jm = self.register(job, old.job_graph().clone(), id).await?;
        jm.start_at_attempt(attempt);
        jm.launch().await?;
        tracing::info!(
            job,
            checkpoint = id,
            from = part.id,
            "job restored from a savepoint"
        );
        self.checkpoint_now(job).await
    }

    /// The JobMaster of `job` (for RPC from TaskManagers).
    pub(crate) fn job_master(&self, job: u64) -> Option<Arc<JobMaster>> {
        self.jobs.lock().ok()?.get(&job).cloned()
    }

    /// Stops a job; with `drop_state` its state is deleted too.
    pub async fn cancel_job(&self, job: u64, drop_state: bool) -> Result<()> {
        let jm = self.jobs.lock().map_err(|_| poisoned())?.remove(&job);
        if drop_state {
            self.holds.release(job);
        }
        match jm {
            Some(jm) => jm.stop(drop_state).await,
            None => {
                // A job that never started here (it could not be restored)
                // may still have checkpoints from an earlier run.
                if drop_state {
                    self.storage.drop_job(job).await?;
                }
                Err(ClusterError::UnknownJob(job))
            }
        }
    }

    /// Stops every job, keeping their state (server shutdown).
    pub async fn shutdown(&self) {
        let jobs: Vec<_> = match self.jobs.lock() {
            Ok(mut j) => std::mem::take(&mut *j).into_values().collect(),
            Err(_) => return,
        };
        for jm in jobs {
            let _ = jm.stop(false).await;
        }
    }

    /// The ExecutionGraph `graph` would get now (for EXPLAIN).
    pub fn preview(&self, graph: JobGraph) -> Result<ExecutionGraph> {
        let slots = self
            .rm
            .preview_slots(ExecutionGraph::slots_needed(&graph))?;
        Ok(ExecutionGraph::build(graph, &slots)?)
    }

    /// Waits until every job reading one of `targets`' tables has completed a
    /// checkpoint past the given log position, and every job reading a
    /// connector one (triggered after this call) where no source had more
    /// to read (`FLUSH`).
    ///
    /// A job reading a view waits, in a later round, for the epoch that
    /// view's job completed once the round before it was done: one round
    /// per level of the longest chain of views over views.
    pub async fn flush(&self, targets: &HashMap<u64, u64>) -> Result<()> {
        let jobs: Vec<Arc<JobMaster>> = self
            .jobs
            .lock()
            .map_err(|_| poisoned())?
            .values()
            .cloned()
            .collect();
        let mut targets = targets.clone();
        for round in 0..=chain_depth(&jobs) {
            if round > 0 {
                for jm in &jobs {
                    for view in jm.source_views() {
                        if let Ok(upstream) = self.master(view) {
                            targets.insert(view, upstream.completed().borrow().id);
                        }
                    }
                }
            }
            let waits = jobs.iter().filter_map(|jm| {
                let needed: HashMap<u64, u64> = jm
                    .source_tables()
                    .into_iter()
                    .chain(jm.source_views())
                    .filter_map(|t| targets.get(&t).filter(|seq| **seq > 0).map(|seq| (t, *seq)))
                    .collect();
                let connectors = round == 0 && jm.reads_connectors();
                (!needed.is_empty() || connectors)
                    .then(|| Self::wait_for(jm.clone(), needed, connectors))
            });
            for r in futures::future::join_all(waits).await {
                r?;
            }
        }
        Ok(())
    }

    /// Every job's dead-letter tables: `(job, table, writers)`, the job's
    /// subtasks `0..writers` writing the table (see
    /// `executor::operators::connector_source`).
    pub fn dead_letter_writers(&self) -> Vec<(u64, u64, usize)> {
        self.of_every_job(JobMaster::dead_letter_tables)
            .into_iter()
            .map(|(job, (table, writers))| (job, table, writers))
            .collect()
    }

    /// `f` of every job's JobMaster, each item with its job.
    fn of_every_job<T>(&self, f: impl Fn(&JobMaster) -> Vec<T>) -> Vec<(u64, T)> {
        let Ok(jobs) = self.jobs.lock() else {
            return Vec::new();
        };
        jobs.values()
            .flat_map(|jm| f(jm).into_iter().map(move |t| (jm.job, t)))
            .collect()
    }

    /// Waits, as `FLUSH` does for a job that reads connectors, until a
    /// checkpoint of `job` holds what its connectors held when called;
    /// returns that checkpoint's id (`None`: the job was cancelled).
    pub async fn flush_job(&self, job: u64) -> Result<Option<u64>> {
        let jm = self.master(job)?;
        let after = jm.next_checkpoint_id();
        let done = Self::wait_until(&jm, |c| c.id > after && !c.behind).await?;
        Ok(done.then(|| jm.completed().borrow().id))
    }

    /// Triggers a checkpoint of `job` and waits until one triggered after
    /// this call has completed.
    pub async fn checkpoint_now(&self, job: u64) -> Result<()> {
        let jm = self.master(job)?;
        let after = jm.next_checkpoint_id();
        match Self::wait_until(&jm, |c| c.id >= after).await? {
            true => Ok(()),
            false => Err(ClusterError::UnknownJob(job)),
        }
    }

    /// Triggers checkpoints of `jm` until a completed one satisfies `done`.
    /// After one whose sources were behind it pauses for [`BEHIND_PAUSE`].
    /// `Ok(false)` if the job was cancelled first; an error if it failed.
    async fn wait_until(
        jm: &JobMaster,
        done: impl Fn(&CompletedCheckpoint) -> bool,
    ) -> Result<bool> {
        let mut completed = jm.completed();
        loop {
            if done(&completed.borrow_and_update()) {
                return Ok(true);
            }
            match jm.state() {
                JobState::Failed(error) => {
                    return Err(ClusterError::JobFailed { job: jm.job, error });
                }
                JobState::Canceled => return Ok(false),
                JobState::Running | JobState::Restarting | JobState::Created => {}
            }
            if completed.borrow().behind {
                // Let the sources read (and find out what there is) first.
                tokio::time::sleep(BEHIND_PAUSE).await;
            }
            jm.trigger_now();
            // Re-check the job state now and then, in case it fails meanwhile.
            let _ =
                tokio::time::timeout(std::time::Duration::from_millis(500), completed.changed())
                    .await;
        }
    }

    async fn wait_for(
        jm: Arc<JobMaster>,
        needed: HashMap<u64, u64>,
        connectors: bool,
    ) -> Result<()> {
        // The first checkpoint triggered after FLUSH. A connector source
        // says it is caught up as of the barrier before the one it acks, so
        // a job reading connectors needs a later one: then whatever was
        // written to its sources before FLUSH is in.
        let after = jm.next_checkpoint_id();
        // A job cancelled meanwhile (its view dropped) has nothing left to show.
        Self::wait_until(&jm, |c| {
            needed
                .iter()
                .all(|(t, seq)| c.positions.get(t).is_some_and(|p| p >= seq))
                && (!connectors || c.id > after && !c.behind)
        })
        .await
        .map(|_| ())
    }

    /// For every job: the tables its sources read, and the log positions of
    /// its oldest retained checkpoint — a restore may go back that far —
    /// (`None` before its first one).
    pub fn source_positions(&self) -> Vec<JobSources> {
        let Ok(jobs) = self.jobs.lock() else {
            return Vec::new();
        };
        jobs.values()
            .map(|jm| JobSources {
                tables: jm.source_tables(),
                positions: self.oldest_positions(jm),
            })
            .collect()
    }

    /// Every job that reads views: its id, the views, and the epochs of
    /// its oldest retained checkpoint (as [`JobManager::source_positions`]).
    pub(crate) fn view_sources(&self) -> Vec<ViewReader> {
        let Ok(jobs) = self.jobs.lock() else {
            return Vec::new();
        };
        jobs.values()
            .map(|jm| (jm.job, jm.source_views(), jm))
            .filter(|(_, views, _)| !views.is_empty())
            .map(|(job, views, jm)| ViewReader {
                job,
                views,
                positions: self.oldest_positions(jm),
            })
            .collect()
    }

    /// Where `jm`'s oldest retained checkpoint left its sources, or a
    /// savepoint, if it left one further back.
    fn oldest_positions(&self, jm: &JobMaster) -> Option<HashMap<u64, u64>> {
        let mut positions = jm.truncation_positions();
        // A savepoint may take the job back to where it was.
        if let (Some(p), Ok(savepoints)) = (&mut positions, self.savepoints.lock()) {
            for part in savepoints.values().flat_map(|s| &s.jobs) {
                if part.job == jm.job {
                    for (t, seq) in &part.positions {
                        p.entry(*t).and_modify(|s| *s = (*s).min(*seq));
                    }
                }
            }
        }
        positions
    }

    /// Recent checkpoints of every job: `(job, checkpoint)`.
    pub fn checkpoints(&self) -> Vec<(u64, crate::CheckpointStats)> {
        self.of_every_job(JobMaster::checkpoint_history)
    }

    /// Every job's operator state per subtask: (job, vertex, subtask,
    /// stats).
    pub fn state_stats(&self) -> Vec<(u64, usize, usize, executor::state::OperatorStateStats)> {
        self.of_every_job(JobMaster::state_stats)
            .into_iter()
            .map(|(job, (v, s, st))| (job, v, s, st))
            .collect()
    }

    /// Triggers a checkpoint of every job and waits until each has
    /// completed one triggered after this call (`CHECKPOINT`).
    pub async fn checkpoint_all(&self) -> Result<()> {
        let jobs: Vec<u64> = self
            .jobs
            .lock()
            .map_err(|_| poisoned())?
            .keys()
            .copied()
            .collect();
        let waits = jobs.into_iter().map(|job| async move {
            match self.checkpoint_now(job).await {
                // Dropped meanwhile: nothing to wait for.
                Err(ClusterError::UnknownJob(_)) => Ok(()),
                other => other,
            }
        });
        for r in futures::future::join_all(waits).await {
            r?;
        }
        Ok(())
    }

    /// Every job with its subtasks.
    pub fn jobs(&self) -> Vec<JobStatus> {
        let Ok(jobs) = self.jobs.lock() else {
            return Vec::new();
        };
        jobs.values()
            .map(|jm| {
                let subtasks = jm
                    .execution_graph()
                    .map(|eg| {
                        eg.all()
                            .map(|ev| {
                                (
                                    eg.job.vertex_name(ev.vertex),
                                    ev.subtask,
                                    ev.slot.to_string(),
                                    ev.state,
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let state = match jm.state() {
                    JobState::Created => "CREATED".to_string(),
                    JobState::Running => "RUNNING".to_string(),
                    JobState::Restarting => "RESTARTING".to_string(),
                    JobState::Failed(e) => format!("FAILED: {e}"),
                    JobState::Canceled => "CANCELED".to_string(),
                };
                let (attempt, restarts) = jm.attempts();
                JobStatus {
                    job: jm.job,
                    restored_checkpoint: jm.restored_checkpoint(),
                    state,
                    last_checkpoint: jm.completed().borrow().id,
                    attempt,
                    restarts,
                    subtasks,
                }
            })
            .collect()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The most views over views in one chain among `jobs`: 0 when no job
/// reads a view.
fn chain_depth(jobs: &[Arc<JobMaster>]) -> usize {
    let reads: HashMap<u64, Vec<u64>> = jobs.iter().map(|j| (j.job, j.source_views())).collect();
    fn depth(job: u64, reads: &HashMap<u64, Vec<u64>>, seen: usize) -> usize {
        match reads.get(&job) {
            // (A chain is never longer than the jobs there are.)
            Some(views) if !views.is_empty() && seen < reads.len() => {
                1 + views
                    .iter()
                    .map(|v| depth(*v, reads, seen + 1))
                    .max()
                    .unwrap_or(0)
            }
            _ => 0,
        }
    }
    reads
        .keys()
        .map(|j| depth(*j, &reads, 0))
        .max()
        .unwrap_or(0)
}
