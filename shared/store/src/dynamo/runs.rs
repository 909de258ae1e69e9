//! The run log's port ([`RunStore`]) on DynamoDB: create, append and end are plans for
//! the commit engine; appends from one process share a lane (group commit). The runs
//! listing reads the index `runs_by_project` (`project_runs`, `created_at`), which
//! projects only the listing's fields: appends never write it, only a run's creation
//! and its end do.

use async_trait::async_trait;
use serde_json::{Map, Value};
use tollgate_domain::{now_millis, EventDraft, NewRun, RunHead, TerminalKind};

use super::commit::{Budget, Committed, Plan, RunWrite, WriteKind};
use super::item::{get_n, get_s, opt_s, s, unavailable};
use super::lanes::{approx_stored_bytes, Lane, QueuedAppend};
use super::policies::{cursor_from_key, start_key_of_tenant};
use super::DynamoStore;
use crate::{
    check_batch, ended_run_answer, ApprovalStore, CreateOutcome, EventPage, Finished, RunRef,
    RunStore, StoreError,
};

/// The index of the runs table by tenant, newest first.
pub const RUNS_BY_PROJECT: &str = "runs_by_project";

/// The partition of a run's tenant in [`RUNS_BY_PROJECT`]: `p:<project>`, or `~` for
/// the runs without a project.
pub(crate) fn project_runs_key(project_id: Option<&str>) -> String {
    match project_id {
        Some(p) => format!("p:{p}"),
        None => "~".to_owned(),
    }
}

fn summary_from_item(
    item: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
) -> Result<crate::RunSummary, StoreError> {
    let corrupt = |what: &str| StoreError::Unavailable(format!("corrupt run index item: {what}"));
    Ok(crate::RunSummary {
        run_id: get_s(item, "run_id")?,
        kind: tollgate_domain::RunKind::parse(&get_s(item, "kind")?)
            .ok_or_else(|| corrupt("kind"))?,
        status: tollgate_domain::RunStatus::parse(&get_s(item, "status")?)
            .ok_or_else(|| corrupt("status"))?,
        owner: opt_s(item, "owner"),
        project_id: opt_s(item, "project_id"),
        channel_id: opt_s(item, "channel_id"),
        created_at: get_n(item, "created_at")?,
        ended_at: item
            .get("ended_at")
            .map(|_| get_n(item, "ended_at"))
            .transpose()?,
    })
}

impl DynamoStore {
    /// A page of one tenant's runs from [`RUNS_BY_PROJECT`], newest first. Each `Query`
    /// asks for at most what the page still lacks (and what is left of
    /// [`crate::MAX_RUNS_EXAMINED`]), the filter applied by DynamoDB
    /// (`FilterExpression`): its `LastEvaluatedKey` is the position right after the last
    /// run read, and that key is the cursor.
    async fn runs_page(
        &self,
        project_id: Option<&str>,
        filter: &crate::RunFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<crate::RunPage, StoreError> {
        let names = [
            ("run_id", false),
            ("project_runs", false),
            ("created_at", true),
        ];
        let partition = project_runs_key(project_id);
        let mut start = match cursor {
            None => None,
            Some(c) => Some(start_key_of_tenant(
                c,
                &names,
                Some(("project_runs", partition.clone())),
            )?),
        };
        let limit = limit.max(1);
        let mut conditions = Vec::new();
        let mut values = vec![(":pk", s(&partition))];
        let mut attribute_names = Vec::new();
        if let Some(status) = filter.status {
            conditions.push("#status = :status");
            attribute_names.push(("#status", "status"));
            values.push((":status", s(status.as_str())));
        }
        if let Some(owner) = &filter.owner {
            conditions.push("#owner = :owner");
            attribute_names.push(("#owner", "owner"));
            values.push((":owner", s(owner)));
        }
        if let Some(prefix) = &filter.run_id_prefix {
            conditions.push("begins_with(run_id, :prefix)");
            values.push((":prefix", s(prefix)));
        }
        let mut runs = Vec::new();
        let mut examined = 0usize;
        loop {
            let want = (limit - runs.len()).min(crate::MAX_RUNS_EXAMINED - examined);
            let mut query = self
                .client
                .query()
                .table_name(&self.tables.runs)
                .index_name(RUNS_BY_PROJECT)
                .key_condition_expression("project_runs = :pk")
                .scan_index_forward(false)
                .limit(want as i32)
                .set_exclusive_start_key(start.take());
            if !conditions.is_empty() {
                query = query.filter_expression(conditions.join(" AND "));
            }
            for (name, attribute) in &attribute_names {
                query = query.expression_attribute_names(*name, *attribute);
            }
            for (name, value) in &values {
                query = query.expression_attribute_values(*name, value.clone());
            }
            let out = query.send().await.map_err(unavailable)?;
            examined += out.scanned_count().max(0) as usize;
            for item in out.items.unwrap_or_default() {
                runs.push(summary_from_item(&item)?);
            }
            start = out.last_evaluated_key;
            if start.is_none() || runs.len() >= limit || examined >= crate::MAX_RUNS_EXAMINED {
                break;
            }
        }
        let next_cursor = start.and_then(|key| cursor_from_key(&key, &names));
        Ok(crate::RunPage { runs, next_cursor })
    }

    /// Writes one group of queued appends (all naming one incarnation) and answers each.
    async fn write_group(&self, run_id: &str, group: Vec<QueuedAppend>, lane: &mut Lane) {
        let combined: Vec<EventDraft> = group
            .iter()
            .flat_map(|q| q.events.iter().cloned())
            .collect();
        let incarnation = group.first().and_then(|q| q.incarnation.clone());
        let run = RunRef {
            run_id,
            incarnation: incarnation.as_deref(),
        };
        match self.append_in_lane(run, combined, Some(lane)).await {
            Ok(sequences) => {
                let mut rest = sequences.as_slice();
                for q in group {
                    let (mine, tail) = rest.split_at(q.events.len());
                    rest = tail;
                    let _ = q.reply.send(Ok(mine.to_vec()));
                }
            }
            // On an ended run each request still deserves its own answer (a pure retry
            // of events that landed before the end gets their sequences).
            Err(StoreError::RunTerminal { .. }) if group.len() > 1 => {
                for q in group {
                    let answer = self.append_in_lane(run, q.events, Some(lane)).await;
                    let _ = q.reply.send(answer);
                }
            }
            Err(e) => {
                for q in group {
                    let _ = q.reply.send(Err(e.clone()));
                }
            }
        }
    }

    /// One append, in one transaction (retried on lost races and throttling), holding
    /// the run's lane when there is one.
    async fn append_in_lane(
        &self,
        run: RunRef<'_>,
        events: Vec<EventDraft>,
        mut lane: Option<&mut Lane>,
    ) -> Result<Vec<u64>, StoreError> {
        let run_id = run.run_id;
        let mut budget = Budget::new(self.contention_budget, "append");
        let mut sequences: Vec<Option<u64>> = vec![None; events.len()];
        let mut head = self.append_head(&mut lane, run).await?;
        loop {
            let pending: Vec<usize> = (0..events.len())
                .filter(|i| sequences[*i].is_none())
                .collect();
            if pending.is_empty() {
                break;
            }
            if head.status.is_terminal() {
                // A retry of events that landed before the end still gets its answer.
                let ids: Vec<&str> = pending
                    .iter()
                    .filter_map(|i| events[*i].event_id.as_deref())
                    .collect();
                if ids.len() == pending.len() {
                    let found = self.existing_event_ids(run_id, &ids).await?;
                    for i in &pending {
                        let id = events[*i].event_id.as_deref().unwrap_or_default();
                        sequences[*i] = found.get(id).copied();
                    }
                    if sequences.iter().all(Option::is_some) {
                        break;
                    }
                }
                return Err(StoreError::RunTerminal {
                    status: head.status,
                    terminal_seq: head.terminal_seq.unwrap_or(head.last_sequence()),
                });
            }
            let plan = Plan {
                runs: vec![RunWrite {
                    head: head.clone(),
                    kind: WriteKind::Advance { end: None },
                    events: pending.iter().map(|i| events[*i].clone()).collect(),
                    open_cards: 0,
                    budget_used: None,
                }],
                side: Vec::new(),
            };
            match self.commit(&plan).await? {
                Committed::Done { now } => {
                    let first = head.next_seq;
                    for (offset, i) in pending.iter().enumerate() {
                        sequences[*i] = Some(first + offset as u64);
                    }
                    head.next_seq = first + pending.len() as u64;
                    head.record(pending.iter().map(|i| events[*i].event_type.as_str()), now);
                    if let Some(lane) = lane.as_mut() {
                        *lane.head = Some(head);
                    }
                    break;
                }
                Committed::Lost(lost) => {
                    // Keyed events already stored are duplicates: take their sequences.
                    for (offset, i) in pending.iter().enumerate() {
                        if let Some(seq) = lost.taken[0][offset] {
                            sequences[*i] = Some(seq);
                        }
                    }
                    let answered = lost.taken[0].iter().any(Option::is_some);
                    match &lost.heads[0] {
                        Some(Some(stored)) => {
                            head = stored.clone();
                            run.check(&head)?;
                        }
                        Some(None) => return Err(StoreError::NotFound),
                        // Head held; only duplicates failed: retry the rest at once.
                        None if answered => continue,
                        // Head held yet an event key was taken: the stored events are
                        // ahead of the head. Never guess a sequence; fail closed.
                        None => {
                            return Err(StoreError::Unavailable(format!(
                                "run {run_id}: stored events are ahead of the run head"
                            )))
                        }
                    }
                }
                Committed::Busy(why) => {
                    tracing::debug!(run_id, %why, "append retry");
                    head = self.live_head(run).await?;
                }
            }
            budget.next().await?;
        }
        Ok(sequences.into_iter().flatten().collect())
    }
}

#[async_trait]
impl RunStore for DynamoStore {
    async fn create_run(&self, new: NewRun) -> Result<CreateOutcome, StoreError> {
        // Invariant: a run id is never created again over another run's leftovers (TTL
        // may delete a head before its events, or `run_started` before the rest). No
        // event can appear between this read and the transaction: every write but this
        // create needs the head.
        if self.has_any_item(&new.run_id).await? {
            return match self.get_head(&new.run_id).await? {
                Some(existing) => Ok(CreateOutcome::Existing(existing)),
                None => Err(StoreError::Conflict(
                    "run id has leftover events; choose another run id".into(),
                )),
            };
        }
        let head = new.head(now_millis());
        let plan = Plan {
            runs: vec![RunWrite {
                head: head.clone(),
                kind: WriteKind::Create,
                events: vec![new.started_event()],
                open_cards: 0,
                budget_used: None,
            }],
            side: Vec::new(),
        };
        let mut budget = Budget::new(self.contention_budget, "create");
        loop {
            match self.commit(&plan).await? {
                Committed::Done { .. } => return Ok(CreateOutcome::Created(head)),
                Committed::Lost(lost) => {
                    return match lost.heads.into_iter().next().flatten().flatten() {
                        Some(existing) => Ok(CreateOutcome::Existing(existing)),
                        // Only `seq#1` existed without a head: a half-deleted run.
                        None => Err(StoreError::Conflict(
                            "run id has leftover events; choose another run id".into(),
                        )),
                    };
                }
                Committed::Busy(why) => {
                    tracing::debug!(run_id = %new.run_id, %why, "create_run retry");
                    budget.next().await?;
                    if let Some(head) = self.get_head(&new.run_id).await? {
                        return Ok(CreateOutcome::Existing(head));
                    }
                }
            }
        }
    }

    async fn append_events(
        &self,
        run: RunRef<'_>,
        events: Vec<EventDraft>,
    ) -> Result<Vec<u64>, StoreError> {
        check_batch(&events)?;
        let Some(lanes) = &self.lanes else {
            return self.append_in_lane(run, events, None).await;
        };
        let state = lanes.state(run.run_id);
        let (reply, answer) = tokio::sync::oneshot::channel();
        state
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(QueuedAppend {
                incarnation: run.incarnation.map(str::to_owned),
                bytes: approx_stored_bytes(&events),
                events,
                reply,
            });
        // The lane is drained by a task of its own, so a caller that goes away (a client
        // disconnecting drops its request future) cannot abandon a transaction half-way
        // or strand the appends grouped with its own.
        let store = self.clone();
        let run_id = run.run_id.to_owned();
        tokio::spawn(async move {
            // One group per turn on the lane: a waiting `finish_run` gets its turn between
            // groups instead of waiting for the queue to run dry.
            loop {
                let mut lane = Lane::enter(state.clone()).await;
                let group = lane.take_group();
                if group.is_empty() {
                    break;
                }
                store.write_group(&run_id, group, &mut lane).await;
            }
        });
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("append was dropped; retry".into())))
    }

    async fn finish_run(
        &self,
        run: RunRef<'_>,
        kind: TerminalKind,
        payload: Map<String, Value>,
    ) -> Result<Finished, StoreError> {
        let run_id = run.run_id;
        let mut lane = self.enter_lane(run_id).await;
        let mut lane = lane.as_mut();
        let mut budget = Budget::new(self.contention_budget, "terminal transition");
        let draft = EventDraft::server(kind.event_type(), payload);
        let mut head = self.starting_head(&mut lane, run).await?;
        loop {
            if head.status.is_terminal() {
                let answer = ended_run_answer(&head, kind)?;
                // A repeat completes what a stop right after the end left.
                self.expire_mutations_with_run(run_id, head.last_event_at)
                    .await;
                return Ok(answer);
            }
            // Invariant 3: the cards a run's end closes are announced before its terminal
            // event, each in a transaction of its own (`Gate::finish_run`); this one
            // refuses while the head counts one. The commit below is conditioned on the
            // head as read, so a card armed since makes it lose and read again.
            if head.open_cards > 0 {
                let pending = self.pending_cards(run_id).await?.len() as u64;
                if pending > 0 {
                    return Err(StoreError::CardsOpen(pending));
                }
                // A count with no card behind it (a card item removed by hand, say) must
                // not keep the run from ending.
                tracing::warn!(
                    run_id,
                    counted = head.open_cards,
                    "run head counts pending cards that are not stored; ending it"
                );
            }
            let plan = Plan {
                runs: vec![RunWrite {
                    head: head.clone(),
                    kind: WriteKind::Advance { end: Some(kind) },
                    events: vec![draft.clone()],
                    open_cards: 0,
                    budget_used: None,
                }],
                side: Vec::new(),
            };
            match self.commit(&plan).await? {
                Committed::Done { now } => {
                    // The run can start no call any more: its mutation records may now
                    // go with it (see `mutation_item`).
                    self.expire_mutations_with_run(run_id, now).await;
                    let seq = head.next_seq;
                    head.next_seq = seq + 1;
                    head.status = kind.status();
                    head.terminal_seq = Some(seq);
                    head.record([kind.event_type()], now);
                    if let Some(lane) = lane.as_mut() {
                        *lane.head = Some(head);
                    }
                    return Ok(Finished {
                        sequence: seq,
                        already_finished: false,
                        open_cards: 0,
                    });
                }
                Committed::Lost(lost) => match lost.heads.into_iter().next().flatten() {
                    Some(Some(stored)) => {
                        head = stored;
                        run.check(&head)?;
                    }
                    Some(None) => return Err(StoreError::NotFound),
                    // Head held yet the terminal event's key was taken: the stored events
                    // are ahead of the head. Never guess; fail closed (as appends do).
                    None => {
                        return Err(StoreError::Unavailable(format!(
                            "run {run_id}: stored events are ahead of the run head"
                        )))
                    }
                },
                Committed::Busy(why) => {
                    tracing::debug!(run_id, %why, "finish retry");
                    head = self.live_head(run).await?;
                }
            }
            budget.next().await?;
        }
    }

    async fn read_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        self.get_head(run_id).await
    }

    async fn read_head_lagging(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        self.get_head_eventually(run_id).await
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<EventPage, StoreError> {
        self.query_events(run_id, after, limit).await
    }

    async fn list_runs(
        &self,
        project_id: Option<&str>,
        filter: &crate::RunFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<crate::RunPage, StoreError> {
        self.runs_page(project_id, filter, cursor, limit).await
    }
}
