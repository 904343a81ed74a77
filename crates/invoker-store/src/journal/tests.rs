//! The journal's tests: kills, damage, a full disk, and what a restart reads.

use super::lines::reread_line;
use super::*;
use crate::contract::QueuedCall;
use invoker_wire::model::Outcome;
use invoker_wire::model::{Action, ActivationRecord, EncodedRecord};
use std::io::Write;

fn meta(id: &str) -> ActivationMeta {
    ActivationMeta::for_test(id)
}

fn open(dir: &Path) -> JournaledStore {
    JournaledStore::open(&dir.join("s.redb"), &dir.join("journal")).unwrap()
}

fn record(id: &str) -> ActivationRecord {
    let mut r = ActivationRecord::whisk_error(&meta(id), "x", 5);
    r.response = invoker_wire::model::ActivationResponse::new(Outcome::Success, serde_json::json!({"ok": true}));
    r.status_code = 0;
    r
}

/// The store's files at `from` (journal segments and redb), copied to `to` as a killed
/// process leaves them.
fn copy_store(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("journal")).unwrap();
    for (_, path) in segments(&from.join("journal")).unwrap() {
        std::fs::copy(&path, to.join("journal").join(path.file_name().unwrap())).unwrap();
    }
    std::fs::copy(from.join("s.redb"), to.join("s.redb")).unwrap();
}

#[test]
fn records_are_visible_at_once_and_survive_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert_eq!(store.accept(&meta("a1")).unwrap(), Accepted::New);
    assert_eq!(store.accept(&meta("a1")).unwrap(), Accepted::Pending { namespace: "guest".into() });
    store.finish(&record("a1").into()).unwrap();
    assert_eq!(store.get_activation("a1").unwrap().unwrap().activation_id, "a1");
    store.flush().unwrap();
    assert_eq!(store.get_activation("a1").unwrap().unwrap(), record("a1"), "the journal's bytes, stored whole");
    assert!(matches!(store.accept(&meta("a1")).unwrap(), Accepted::Finished(_)));
    assert_eq!(store.list_activations("guest", None, 0, 10).unwrap().len(), 1);
}

/// An activation finished before any flush saw it accepted never reaches redb's pending
/// table (its record is one write and its index entry); one whose acceptance was flushed
/// first has that entry removed when its record is. Neither is unfinished after a restart.
#[test]
fn a_pending_entry_is_removed_from_redb_only_where_a_flush_wrote_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.accept(&meta("quick")).unwrap();
    store.finish(&record("quick").into()).unwrap();
    store.accept(&meta("slow")).unwrap();
    store.flush().unwrap();
    let pending = |store: &JournaledStore| -> Vec<String> {
        store.inner.db.pending().unwrap().into_iter().map(|m| m.activation_id).collect()
    };
    assert_eq!(pending(&store), ["slow"], "only what was still running when it flushed");
    store.finish(&record("slow").into()).unwrap();
    store.flush().unwrap();
    assert!(pending(&store).is_empty());
    drop(store);
    let store = open(dir.path());
    assert!(store.recover_unfinished(9).unwrap().guessed.is_empty());
    assert_eq!(store.list_activations("guest", None, 0, 10).unwrap().len(), 2);
}

#[test]
fn the_action_cache_follows_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let action = |code: &str| Action { version: String::new(), revision: 0, ..Action::for_test("a", code) };
    store.put_action(action("one"), false).unwrap();
    assert_eq!(store.get_action("guest", "a").unwrap().unwrap().exec.code.as_deref(), Some("one"));
    store.put_action(action("two"), true).unwrap();
    let cached = store.get_action("guest", "a").unwrap().unwrap();
    assert_eq!((cached.exec.code.as_deref(), cached.version.as_str()), (Some("two"), "0.0.2"));
    store.delete_action("guest", "a").unwrap();
    assert!(store.get_action("guest", "a").unwrap().is_none());
}

#[test]
fn a_flush_hands_its_records_to_redb_in_id_order() {
    let finished: FxHashMap<String, Finished> = (0..64)
        .map(|n| invoker_wire::model::new_activation_id() + &format!("{n}"))
        .map(|id| {
            let record = EncodedRecord::new(record(&id));
            (id, Finished { record, journaled: true, pending_in_db: false })
        })
        .collect();
    let ids: Vec<&str> = in_id_order(&finished).iter().map(|r| r.0.head().activation_id.as_str()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

/// A run that finished "done" and left "open" running, killed: a copy of its journal as
/// the kill left it (no flush, no drop: only the segments on disk remain).
fn killed_run(dir: &Path) -> tempfile::TempDir {
    let store = open(dir);
    store.accept(&meta("done")).unwrap();
    store.finish(&record("done").into()).unwrap();
    store.accept(&meta("open")).unwrap();
    store.killed();
    let copy = tempfile::tempdir().unwrap();
    for (_, path) in segments(&dir.join("journal")).unwrap() {
        std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
    }
    copy
}

#[test]
fn a_killed_run_is_replayed_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let copy = killed_run(dir.path());
    let mut torn = File::options().append(true).open(segments(copy.path()).unwrap()[0].1.clone()).unwrap();
    torn.write_all(b"{\"A\":{\"activation_id\":").unwrap();
    let store = JournaledStore::open(&dir.path().join("s2.redb"), copy.path()).unwrap();
    assert_eq!(store.get_activation("done").unwrap().unwrap().response.status_code, 0);
    assert_eq!(store.recover_unfinished(9).unwrap().guessed.len(), 1, "the open one gets its whisk-error record");
    assert_eq!(store.get_activation("open").unwrap().unwrap().response.status_code, 3);
}

/// A segment's room not yet written (zeros, `segment.rs`) is its end, not damage: a kill
/// leaves it, and the restart replays the lines before it and sets nothing aside.
#[test]
fn the_unwritten_room_of_a_killed_runs_segment_is_no_damage() {
    let dir = tempfile::tempdir().unwrap();
    let copy = killed_run(dir.path());
    let found = segments(copy.path()).unwrap();
    let room = std::fs::metadata(&found.last().unwrap().1).unwrap().len();
    assert_eq!(room, crate::segment::ROOM_STEP, "the lines' segment has its room, zeros after them");
    let store = JournaledStore::open(&dir.path().join("s2.redb"), copy.path()).unwrap();
    assert_eq!(store.get_activation("done").unwrap().unwrap().response.status_code, 0);
    assert_eq!(store.recover_unfinished(9).unwrap().guessed.len(), 1);
    let aside: Vec<_> = std::fs::read_dir(copy.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(DAMAGED))
        .collect();
    assert!(aside.is_empty(), "set aside as damaged: {aside:?}");
}

fn queued(id: &str) -> (QueuedCall, Vec<u8>) {
    let call = QueuedCall {
        meta: meta(id),
        params: invoker_wire::params::Params::from_map(serde_json::json!({ "n": id }).as_object().expect("an object")),
        request: None,
        api_key: None,
        transaction_id: "t".into(),
        expires_at: 99,
        attempt: 1,
        max_attempts: 3,
        retry_of: None,
        not_before: 0,
        on_success: None,
        on_failure: None,
    };
    let json = serde_json::to_vec(&call).unwrap();
    (call, json)
}

/// Asynchronous calls across SIGKILLs, whether a flush came between their steps or not:
/// those never started stay queued (run by the next start, with their parameters), those
/// that started are interrupted (kept, with their parameters, for their retry policy), one
/// that ended is neither; and a start that recovered them and was killed again before
/// running them leaves them as they were.
#[test]
fn queued_calls_never_started_survive_kills_with_their_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let enqueue = |id: &str| {
        let (call, json) = queued(id);
        assert_eq!(store.enqueue(&call, &json, false).unwrap(), Accepted::New);
    };
    enqueue("flushed");
    enqueue("started-after-flush");
    enqueue("ended");
    store.flush().unwrap();
    store.started("started-after-flush").unwrap();
    enqueue("started-before-flush");
    store.started("started-before-flush").unwrap();
    store.finish(&record("ended").into()).unwrap();
    store.flush().unwrap();
    enqueue("only-journaled");
    store.killed();
    let copy = tempfile::tempdir().unwrap();
    copy_store(dir.path(), copy.path());
    let store = open(copy.path());
    let recovered = store.recover_unfinished(9).unwrap();
    let ids = |calls: &[QueuedCall]| calls.iter().map(|c| c.meta.activation_id.clone()).collect::<Vec<_>>();
    let mut queued_ids = ids(&recovered.queued);
    queued_ids.sort();
    assert_eq!(queued_ids, ["flushed", "only-journaled"]);
    assert!(
        recovered.queued.iter().all(|c| c.params.to_map()["n"] == c.meta.activation_id.as_str()),
        "with its parameters"
    );
    let mut interrupted = ids(&recovered.interrupted);
    interrupted.sort();
    assert_eq!(interrupted, ["started-after-flush", "started-before-flush"]);
    assert!(recovered.interrupted.iter().all(|c| c.params.to_map()["n"] == c.meta.activation_id.as_str()));
    assert!(recovered.guessed.is_empty());
    assert!(store.get_activation("flushed").unwrap().is_none(), "no record while it waits");
    store.killed();
    let again = tempfile::tempdir().unwrap();
    copy_store(copy.path(), again.path());
    let store = open(again.path());
    let recovered = store.recover_unfinished(10).unwrap();
    let mut queued_ids = ids(&recovered.queued);
    queued_ids.sort();
    assert_eq!(queued_ids, ["flushed", "only-journaled"], "still queued until they start");
    assert_eq!(recovered.interrupted.len(), 2, "still pending until their policy ends them");
    assert!(recovered.guessed.is_empty());
    assert_eq!(store.get_activation("ended").unwrap().unwrap().response.status_code, 0);
}

/// SIGKILL after an activation was answered and before its record was whole (its logs
/// still coming through an engine): the restart ends it with the record its caller was
/// told, noting that its logs were not collected, not with a guess; across a flush and a
/// second restart too. One answered and then finished is not touched.
#[test]
fn an_activation_answered_before_its_logs_ends_as_answered_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for id in ["told", "whole"] {
        store.accept(&meta(id)).unwrap();
        store.answered(&record(id).into()).unwrap();
    }
    assert!(store.get_activation("told").unwrap().is_none(), "not shown before it is whole");
    let mut whole = record("whole");
    whole.logs.push("a line".into());
    store.finish(&whole.into()).unwrap();
    store.flush().unwrap();
    // A SIGKILL: no drop; what the journal and redb hold remains, as copied.
    store.killed();
    let copy = tempfile::tempdir().unwrap();
    copy_store(dir.path(), copy.path());
    // Killed again before anything recovered it: the answer is journaled in the new segment.
    open(copy.path()).killed();
    let again = tempfile::tempdir().unwrap();
    copy_store(copy.path(), again.path());
    let store = open(again.path());
    let recovered: Vec<String> =
        store.recover_unfinished(9).unwrap().guessed.into_iter().map(|m| m.activation_id).collect();
    assert_eq!(recovered, ["told"]);
    let told = store.get_activation("told").unwrap().unwrap();
    assert_eq!(told.response, record("told").response, "what its caller was told, not a guess");
    assert!(told.logs.last().unwrap().ends_with(super::super::contract::STOPPED_BEFORE_LOGS), "{:?}", told.logs);
    assert_eq!(store.get_activation("whole").unwrap().unwrap().logs, ["a line"]);
}

/// A segment cut short and corrupt in the middle, a directory named as a segment and a
/// stray file: the store opens, replays every sound line, and keeps the damaged segment
/// aside under another name.
#[test]
fn a_damaged_journal_is_read_as_far_as_it_is_sound_and_kept_aside() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    {
        let store = open(dir.path());
        store.accept(&meta("first")).unwrap();
        store.finish(&record("first").into()).unwrap();
        store.killed();
    }
    let (_, segment) = segments(&journal).unwrap().pop().unwrap();
    let sound = std::fs::read(&segment).unwrap();
    let mut damaged = sound.clone();
    damaged.extend_from_slice(b"\x00\xff not json\n");
    let second = String::from_utf8(sound).unwrap().replace("first", "after");
    damaged.extend_from_slice(second.as_bytes());
    damaged.extend_from_slice(b"{\"F\":{\"activationId\":\"cut");
    std::fs::write(&segment, &damaged).unwrap();
    std::fs::create_dir(journal.join("journal.00000000000000000099")).unwrap();
    std::fs::write(journal.join("notes.txt"), b"stray").unwrap();

    let store = JournaledStore::open(&dir.path().join("s2.redb"), &journal).unwrap();
    assert_eq!(store.get_activation("first").unwrap().unwrap().response.status_code, 0);
    assert_eq!(store.get_activation("after").unwrap().unwrap().response.status_code, 0, "read past the bad line");
    assert!(!segment.exists(), "the damaged segment is not replayed again");
    let aside: Vec<_> = std::fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".damaged"))
        .collect();
    assert_eq!(aside.len(), 1, "kept aside: {aside:?}");
    assert_eq!(std::fs::read(journal.join(&aside[0])).unwrap(), damaged, "as it was");
    assert!(journal.join("journal.00000000000000000099").is_dir() && journal.join("notes.txt").exists());
}

/// Found by the fuzz targets: a number past u64 in a result came back from the journal
/// (and redb) as another number, a little different each time it was read and written.
#[test]
fn a_large_number_in_a_result_reads_back_as_written() {
    let line = br#"{"F":{"namespace":"guest","name":"echo","version":"0.0.1","subject":"guest","activationId":"0123456789abcdef0123456789abcdef","start":1,"end":2,"duration":1,"statusCode":0,"response":{"status":"success","statusCode":0,"success":true,"result":{"x":[118446744073709551616]}},"logs":[],"annotations":[],"publish":false}}"#;
    let once = reread_line(line).expect("a journal line");
    assert_eq!(reread_line(&once).as_deref(), Some(once.as_slice()));
}

/// A store on a small filesystem that fills up: new work is refused with the disk named,
/// what was accepted keeps its record (in memory while nothing can be written), and once
/// space is freed the store writes again by itself, redb opened anew. Needs root (a tmpfs).
#[test]
#[cfg_attr(invoker_without_root, ignore = "needs root: the sandbox, cgroups, a tmpfs (run by .ci/run)")]
fn a_full_disk_refuses_new_work_keeps_every_record_and_recovers_by_itself() {
    if !nix::unistd::geteuid().is_root() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "this test needs root under CI");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let flags = nix::mount::MsFlags::empty();
    nix::mount::mount(Some("tmpfs"), dir.path(), Some("tmpfs"), flags, Some("size=4m")).unwrap();
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(dir.path());
    let options = JournalOptions { end_reserve_bytes: 1 << 20, ..JournalOptions::default() };
    let store = JournaledStore::open_with(&dir.path().join("s.redb"), &dir.path().join("journal"), options).unwrap();
    let big = |id: &str| {
        let mut r = record(id);
        r.response.result = serde_json::json!({ "data": "x".repeat(64 * 1024) }).into();
        EncodedRecord::from(r)
    };
    for id in ["a1", "a2"] {
        assert_eq!(store.accept(&meta(id)).unwrap(), Accepted::New);
    }
    store.flush().unwrap();
    let ballast = dir.path().join("ballast");
    let mut file = File::create(&ballast).unwrap();
    while file.write_all(&[7u8; 64 * 1024]).is_ok() {}
    drop(file);

    store.finish(&big("a1")).unwrap();
    let trouble = store.trouble().expect("the store knows it cannot write");
    assert!(trouble.contains("is full") && trouble.contains(&dir.path().display().to_string()), "{trouble}");
    match store.accept(&meta("a3")) {
        Err(StoreError::Unavailable(reason)) => assert_eq!(reason, trouble),
        other => panic!("new work is refused: {other:?}"),
    }
    // What the reserve gave back beyond the line, taken too.
    let mut more = File::create(dir.path().join("ballast2")).unwrap();
    while more.write_all(&[7u8; 4096]).is_ok() {}
    drop(more);
    assert!(store.flush().is_err(), "nothing can be written");
    let put = store.put_action(Action { version: String::new(), ..Action::for_test("b", "x") }, false);
    assert!(put.as_ref().is_err_and(StoreError::is_storage), "{put:?}");
    assert_eq!(store.get_activation("a1").unwrap().unwrap().activation_id, "a1", "kept in memory");
    // And journaled, with room from the reserve: a stop now would not lose it.
    let journaled = segments(&dir.path().join("journal")).unwrap().iter().any(|(_, path)| {
        std::fs::read_to_string(path).unwrap().lines().any(|l| l.starts_with("{\"F\"") && l.contains("\"a1\""))
    });
    assert!(journaled, "a1's line is in the journal");

    std::fs::remove_file(&ballast).unwrap();
    std::fs::remove_file(dir.path().join("ballast2")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.trouble().is_some() {
        assert!(std::time::Instant::now() < deadline, "the store never recovered: {:?}", store.trouble());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(store.accept(&meta("a3")).unwrap(), Accepted::New);
    store.put_action(Action { version: String::new(), ..Action::for_test("b", "x") }, false).unwrap();
    store.finish(&big("a2")).unwrap();
    store.flush().unwrap();
    for id in ["a1", "a2"] {
        let stored = store.inner.db.get_activation(id).unwrap().expect("in redb");
        assert_eq!(stored, *big(id).record(), "{id}");
    }
}

/// A blocking call that found no room within its wait is kept in the queue under the id it was
/// accepted with (`accept`, then `enqueue` of the same id): across a SIGKILL, whether a flush
/// came between the two or not, it is queued to run, not guessed; once started, interrupted.
#[test]
fn a_blocking_call_kept_in_the_queue_after_its_acceptance_stays_queued_across_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let keep = |id: &str| {
        let (call, json) = queued(id);
        assert_eq!(store.enqueue(&call, &json, false).unwrap(), Accepted::New);
    };
    store.accept(&meta("flushed-between")).unwrap();
    store.flush().unwrap();
    keep("flushed-between");
    store.accept(&meta("journaled-only")).unwrap();
    keep("journaled-only");
    store.accept(&meta("started")).unwrap();
    keep("started");
    store.started("started").unwrap();
    store.killed();
    let copy = tempfile::tempdir().unwrap();
    copy_store(dir.path(), copy.path());
    let store = open(copy.path());
    let recovered = store.recover_unfinished(9).unwrap();
    let mut queued_ids: Vec<_> = recovered.queued.iter().map(|c| c.meta.activation_id.as_str()).collect();
    queued_ids.sort_unstable();
    assert_eq!(queued_ids, ["flushed-between", "journaled-only"]);
    let interrupted: Vec<_> = recovered.interrupted.iter().map(|c| c.meta.activation_id.as_str()).collect();
    assert_eq!(interrupted, ["started"]);
    assert!(recovered.guessed.is_empty(), "none guessed: {:?}", recovered.guessed);
    assert!(store.get_activation("journaled-only").unwrap().is_none(), "no record while it waits");
}

/// A record whose result is large is held as its parts (`JsonParts`): its answered and
/// finished lines, and its value in redb, are written part after part, and read back whole,
/// across a kill and through a flush.
#[test]
fn a_large_results_record_is_written_as_its_parts_and_reads_back_whole() {
    let large = |id: &str| {
        let mut r = record(id);
        let big = "y".repeat(invoker_wire::model::SHARED_RESULT + 7);
        r.response = invoker_wire::model::ActivationResponse::new(Outcome::Success, serde_json::json!({ "big": big }));
        r
    };
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for id in ["told", "whole"] {
        store.accept(&meta(id)).unwrap();
        let answered = EncodedRecord::new(large(id));
        assert!(!answered.json.parts()[1].is_empty(), "the result is a part of its own");
        store.answered(&answered).unwrap();
    }
    let mut whole = large("whole");
    whole.logs.push("a line".into());
    let whole = EncodedRecord::new(whole);
    store.finish(&whole).unwrap();
    // A SIGKILL before any flush: the journal alone has them.
    store.killed();
    let copy = tempfile::tempdir().unwrap();
    copy_store(dir.path(), copy.path());
    let store = open(copy.path());
    let recovered: Vec<String> =
        store.recover_unfinished(9).unwrap().guessed.into_iter().map(|m| m.activation_id).collect();
    assert_eq!(recovered, ["told"]);
    store.flush().unwrap();
    assert_eq!(store.get_activation("told").unwrap().unwrap().response, large("told").response);
    assert_eq!(store.get_activation("whole").unwrap().unwrap(), *whole.record(), "read back from redb");
    // Written into redb from its parts by this run too.
    store.accept(&meta("again")).unwrap();
    let again = EncodedRecord::new(large("again"));
    store.finish(&again).unwrap();
    store.flush().unwrap();
    // Killed after the flush: redb (and the record's file) alone hold it.
    store.killed();
    let after = tempfile::tempdir().unwrap();
    copy_store(copy.path(), after.path());
    std::fs::create_dir_all(after.path().join("s.records")).unwrap();
    for file in std::fs::read_dir(copy.path().join("s.records")).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, after.path().join("s.records").join(file.file_name().unwrap())).unwrap();
    }
    let store = open(after.path());
    assert_eq!(store.get_activation("again").unwrap().unwrap(), *again.record());
}

/// Finished records wait in memory (and in the synced journal) for redb, and the flush thread
/// moves them in by itself: with `INDEX_AT` of them waiting, at its next tick.
#[test]
fn the_flush_thread_moves_waiting_records_into_redb_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let ids: Vec<String> = (0..INDEX_AT).map(|n| format!("{n:032x}")).collect();
    for id in &ids {
        store.accept(&meta(id)).unwrap();
        store.finish(&record(id).into()).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.inner.db.get_activation(&ids[INDEX_AT - 1]).unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the records never reached redb");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(store.inner.state.lock().finished.len() < INDEX_AT, "memory let them go");
    assert_eq!(store.get_activation(&ids[0]).unwrap().unwrap(), record(&ids[0]));
}

/// The flush thread's sync between two flushes into redb: the current segment's lines, each
/// byte once, and a new segment's from its start.
#[test]
fn a_sync_covers_the_lines_written_since_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut syncing = None;
    store.inner.sync_journal(&mut syncing).unwrap();
    assert_eq!(syncing.as_ref().map(|s| s.synced), Some(0), "nothing written, nothing synced");
    store.accept(&meta("s1")).unwrap();
    store.finish(&record("s1").into()).unwrap();
    store.inner.sync_journal(&mut syncing).unwrap();
    let written = store.inner.state.lock().file.written();
    assert!(written > 0);
    assert_eq!(syncing.as_ref().map(|s| s.synced), Some(written));
    store.flush().unwrap();
    store.accept(&meta("s2")).unwrap();
    store.inner.sync_journal(&mut syncing).unwrap();
    let state = store.inner.state.lock();
    let s = syncing.as_ref().unwrap();
    assert_eq!((s.segment, s.synced), (state.segment, state.file.written()), "the new segment's lines");
}
