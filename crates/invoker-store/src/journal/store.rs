//! The journaled store as the [`Store`] the invoker uses: each call on the memory it keeps,
//! the journal's lines and redb.

use super::lines::{accepted_line, queued_line, LineRef, ANSWERED};
use super::{Finished, Inner, JournaledStore, QueueEntry, FLUSH_EVERY};
use crate::contract::{Accepted, DocKind, QueuedCall, Recovered, Store, StoreError};
use invoker_wire::model::{Action, ActivationMeta, ActivationRecord, EncodedRecord};
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;
use std::time::Duration;

impl Store for JournaledStore {
    fn put_action(&self, action: Action, overwrite: bool) -> Result<Action, StoreError> {
        let inner = &self.inner;
        let saved = inner.db.put_action(action, overwrite).map_err(|e| inner.troubled(e))?;
        inner.actions.lock().insert(Arc::new(saved.clone()));
        Ok(saved)
    }

    fn get_action(&self, namespace: &str, name: &str) -> Result<Option<Arc<Action>>, StoreError> {
        let inner = &self.inner;
        if let Some(action) = inner.actions.lock().get(namespace, name) {
            return Ok(Some(action));
        }
        let found = inner.db.get_action(namespace, name).map_err(|e| inner.troubled(e))?;
        if let Some(action) = &found {
            inner.actions.lock().insert(action.clone());
        }
        Ok(found)
    }

    fn list_actions(&self, namespace: &str, skip: usize, limit: usize) -> Result<Vec<Action>, StoreError> {
        self.inner.db.list_actions(namespace, skip, limit).map_err(|e| self.inner.troubled(e))
    }

    fn find_actions(&self, keep: &dyn Fn(&Action) -> bool) -> Result<Vec<Action>, StoreError> {
        self.inner.db.find_actions(keep).map_err(|e| self.inner.troubled(e))
    }

    fn delete_action(&self, namespace: &str, name: &str) -> Result<Option<Action>, StoreError> {
        let inner = &self.inner;
        let deleted = inner.db.delete_action(namespace, name).map_err(|e| inner.troubled(e))?;
        inner.actions.lock().remove(namespace, name);
        Ok(deleted)
    }

    fn accept(&self, meta: &ActivationMeta) -> Result<Accepted, StoreError> {
        let inner = &self.inner;
        inner.check_trouble()?;
        let id = meta.activation_id.as_str();
        let mut state = inner.state.lock();
        // Under the lock, so that two deliveries of one id cannot both be new.
        if let Some(seen) = inner.seen(&state, id)? {
            return Ok(seen);
        }
        Inner::append_line(&mut state, &accepted_line(meta)).map_err(|e| inner.troubled(e))?;
        state.pending.insert(id.to_string(), (meta.clone(), false));
        Ok(Accepted::New)
    }

    fn accept_new(&self, meta: &ActivationMeta) -> Result<(), StoreError> {
        let inner = &self.inner;
        inner.check_trouble()?;
        let mut state = inner.state.lock();
        Inner::append_line(&mut state, &accepted_line(meta)).map_err(|e| inner.troubled(e))?;
        state.pending.insert(meta.activation_id.clone(), (meta.clone(), false));
        Ok(())
    }

    fn enqueue(&self, call: &QueuedCall, json: &[u8], given: bool) -> Result<Accepted, StoreError> {
        let inner = &self.inner;
        inner.check_trouble()?;
        let meta = &call.meta;
        let id = meta.activation_id.as_str();
        // Outside the lock: the parameters may be large.
        let line = queued_line(json);
        let json = bytes::Bytes::copy_from_slice(json);
        let mut state = inner.state.lock();
        if given {
            if let Some(seen) = inner.seen(&state, id)? {
                return Ok(seen);
            }
        }
        Inner::append_line(&mut state, &line).map_err(|e| inner.troubled(e))?;
        state.pending.insert(id.to_string(), (meta.clone(), false));
        state.queued.insert(id.to_string(), QueueEntry { json: Some(json), ..QueueEntry::default() });
        Ok(Accepted::New)
    }

    fn started(&self, id: &str) -> Result<(), StoreError> {
        let inner = &self.inner;
        let mut state = inner.state.lock();
        let at = invoker_wire::model::epoch_ms();
        let line = serde_json::to_vec(&LineRef::S(id, at)).map(|mut l| {
            l.push(b'\n');
            l
        });
        Inner::append_line(&mut state, &line.expect("an id serialises")).map_err(|e| inner.troubled(e))?;
        if let Some(q) = state.queued.get_mut(id) {
            q.started = Some(at);
        }
        Ok(())
    }

    /// Never loses an accepted activation's record: a line the disk has no room for takes it
    /// from the journal's reserve; one that finds the reserve spent too is kept in memory until
    /// a flush moves it into redb (and `write_out` says so if none does before the end).
    fn finish(&self, encoded: &EncodedRecord) -> Result<(), StoreError> {
        let inner = &self.inner;
        let id = &encoded.head().activation_id;
        let mut state = inner.state.lock();
        let journaled = match inner.append_ending(&mut state, &encoded.json) {
            Ok(()) => true,
            Err(e) => {
                drop(state);
                let e = inner.troubled(e);
                tracing::warn!(activation = %id, "record kept in memory until the store writes: {e}");
                state = inner.state.lock();
                false
            }
        };
        let pending_in_db = state.pending.remove(id).is_none_or(|(_, saved)| saved);
        state.answered.remove(id);
        Inner::unqueue(&mut state, id);
        let finished = Finished { record: encoded.clone(), journaled, pending_in_db };
        state.finished.insert(id.clone(), finished);
        Ok(())
    }

    /// One journal line; not shown by reads. A line the disk has no room for is not written:
    /// the activation then ends as a guess if the process stops before its record is whole.
    fn answered(&self, encoded: &EncodedRecord) -> Result<(), StoreError> {
        let mut state = self.inner.state.lock();
        Inner::append_record(&mut state, ANSWERED, &encoded.json)?;
        state.answered.insert(encoded.head().activation_id.clone(), encoded.clone());
        Ok(())
    }

    fn get_activation(&self, id: &str) -> Result<Option<ActivationRecord>, StoreError> {
        {
            let state = self.inner.state.lock();
            if let Some(f) = state.finished.get(id).or_else(|| state.in_flight.get(id)) {
                return Ok(Some(f.record.record().clone()));
            }
        }
        self.inner.db.get_activation(id).map_err(|e| self.inner.troubled(e))
    }

    fn list_activations(
        &self,
        namespace: &str,
        name: Option<&str>,
        skip: usize,
        limit: usize,
    ) -> Result<Vec<ActivationRecord>, StoreError> {
        let mut records: Vec<ActivationRecord> = {
            let state = self.inner.state.lock();
            state
                .finished
                .values()
                .chain(state.in_flight.values())
                .filter(|f| {
                    let head = f.record.head();
                    head.namespace == namespace && name.is_none_or(|n| n == head.name)
                })
                .map(|f| f.record.record().clone())
                .collect()
        };
        let stored = self.inner.db.list_activations(namespace, name, 0, skip.saturating_add(limit));
        // A record in memory is the newer (a guess replaced by what ran may start elsewhere).
        let held: FxHashSet<String> = records.iter().map(|r| r.activation_id.clone()).collect();
        let stored = stored.map_err(|e| self.inner.troubled(e))?;
        records.extend(stored.into_iter().filter(|r| !held.contains(&r.activation_id)));
        records.sort_by(|a, b| (b.start, &b.activation_id).cmp(&(a.start, &a.activation_id)));
        Ok(records.into_iter().skip(skip).take(limit).collect())
    }

    /// The earlier run's unfinished activations (in redb's pending table, and in memory when
    /// the journal could not be applied at open) get whisk-error records at once, in memory
    /// first: on a full disk they reach redb with the first flush that succeeds.
    fn recover_unfinished(&self, now_ms: u64) -> Result<Recovered, StoreError> {
        let inner = &self.inner;
        let mut left: FxHashMap<String, ActivationMeta> =
            inner.db.pending()?.into_iter().map(|m| (m.activation_id.clone(), m)).collect();
        let in_db_queue = inner.db.queued()?;
        let mut state = inner.state.lock();
        left.extend(state.pending.iter().map(|(id, (meta, _))| (id.clone(), meta.clone())));
        // Finished already, on its way to redb: not unfinished.
        left.retain(|id, _| !state.finished.contains_key(id) && !state.in_flight.contains_key(id));
        // Queued and never started: it stays queued (and pending), to be run. Started: it stays
        // pending, for its retry policy.
        let (mut queued, mut interrupted) = (Vec::new(), Vec::new());
        let mut seen = FxHashSet::default();
        let taken_out: FxHashSet<&String> = state.unqueue.iter().collect();
        // One answered before its logs came ended as far as its caller knows: it ends with
        // what was answered, below, and is not tried again.
        let kept = |id: &String| left.contains_key(id) && !state.answered.contains_key(id);
        for (call, started_in_db) in in_db_queue {
            let id = call.meta.activation_id.clone();
            if kept(&id) && !taken_out.contains(&id) && seen.insert(id.clone()) {
                let started = started_in_db || state.queued.get(&id).is_some_and(|q| q.started.is_some());
                if started {
                    interrupted.push(call)
                } else {
                    queued.push(call)
                }
            }
        }
        for (id, q) in &state.queued {
            let Some(json) = &q.json else { continue };
            if kept(id) && seen.insert(id.clone()) {
                if let Ok(call) = serde_json::from_slice::<QueuedCall>(json) {
                    if q.started.is_some() {
                        interrupted.push(call)
                    } else {
                        queued.push(call)
                    }
                }
            }
        }
        left.retain(|id, _| !seen.contains(id));
        for id in left.keys() {
            state.pending.remove(id);
        }
        for (id, meta) in &left {
            // Its caller was answered: the record says what it was told, and that its logs
            // were not collected. Otherwise a guess.
            let record = match state.answered.remove(id) {
                Some(answered) => {
                    let mut record = answered.into_record();
                    record.logs.push(format!(
                        "{} stderr: {}",
                        humantime::format_rfc3339_millis(std::time::SystemTime::now()),
                        crate::contract::STOPPED_BEFORE_LOGS
                    ));
                    record
                }
                None => ActivationRecord::guess(meta, crate::contract::STOPPED_UNFINISHED, now_ms),
            };
            let record = EncodedRecord::new(record);
            state.finished.insert(id.clone(), Finished { record, journaled: false, pending_in_db: true });
        }
        drop(state);
        if let Err(e) = inner.flush() {
            tracing::warn!("the records of unfinished activations are kept in memory until the store writes: {e}");
        }
        queued.sort_by_key(|c| c.meta.accepted_at);
        Ok(Recovered { guessed: left.into_values().collect(), queued, interrupted })
    }

    fn write_out(&self, within: Duration) -> Vec<String> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let alone = self.inner.write_out_once();
            if alone.is_empty() || std::time::Instant::now() >= deadline {
                return alone;
            }
            std::thread::sleep(FLUSH_EVERY);
        }
    }

    fn expire(&self, before_ms: u64) -> Result<usize, StoreError> {
        self.inner.db.expire(before_ms).map_err(|e| self.inner.troubled(e))
    }

    fn trouble(&self) -> Option<String> {
        self.inner.trouble.lock().clone()
    }

    fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.inner.db.get_setting(key).map_err(|e| self.inner.troubled(e))
    }

    fn put_setting(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.inner.db.put_setting(key, value).map_err(|e| self.inner.troubled(e))
    }

    fn get_doc(&self, namespace: &str, kind: DocKind, id: &str) -> Result<Option<String>, StoreError> {
        self.inner.db.get_doc(namespace, kind, id).map_err(|e| self.inner.troubled(e))
    }

    fn list_docs(&self, namespace: &str, kind: DocKind) -> Result<Vec<String>, StoreError> {
        self.inner.db.list_docs(namespace, kind).map_err(|e| self.inner.troubled(e))
    }

    fn docs_generation(&self) -> u64 {
        self.inner.db.docs_generation()
    }

    fn put_doc(
        &self,
        namespace: &str,
        kind: DocKind,
        id: &str,
        value: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.inner.db.put_doc(namespace, kind, id, value).map_err(|e| self.inner.troubled(e))
    }
}
