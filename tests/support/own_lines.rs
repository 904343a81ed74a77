//! One check for every factory: calls back to back, each answered before its lines may all be
//! in, and each record, once whole, holding exactly its own lines (issue 57, item 4).

use super::{python, Invoker};
use serde_json::json;
use std::time::Duration;

/// Back to back: a chatty call (10,000 lines on each stream), silent ones, short ones, and (Fn)
/// a line written 0.2 s after the answer, which goes to a later call and never to its own.
/// OpenWhisk's python action tells its lines by its sentinels; an Fn function by its FDK's log
/// frames (Docker) or by the time its lines came (processes, whose pipes are read at the
/// answer).
pub async fn each_record_holds_exactly_its_own_lines(inv: &Invoker) {
    let ow = "import os, sys\ndef main(a):\n    me = os.environ['__OW_ACTIVATION_ID']\n    for i in range(a.get('lines', 0)):\n        print('out', i, me)\n        print('err', i, me, file=sys.stderr)\n    return {'me': me}\n";
    inv.put_action("ow", python(ow)).await;
    let fn_code = "import io, json, threading\ndef handler(ctx, data: io.BytesIO = None):\n    args = json.loads(data.getvalue())\n    me = ctx.CallID()\n    for i in range(args.get('lines', 0)):\n        print('out', i, me, flush=True)\n    if args.get('late'):\n        threading.Timer(0.2, lambda: print('late', me, flush=True)).start()\n    return json.dumps({'me': me})\n";
    inv.put_action("f", json!({"exec": {"kind": "fn:python", "code": fn_code}})).await;

    for (name, per_line) in [("ow", 2), ("f", 1)] {
        let mut calls = Vec::new();
        for lines in [3, 10_000, 0, 5, 0, 1] {
            let late = name == "f" && lines == 5;
            let (status, answer) = inv.invoke(name, "blocking=true", json!({"lines": lines, "late": late})).await;
            assert_eq!(status, 200, "{name}: {answer}");
            calls.push((lines, late, answer["activationId"].as_str().unwrap().to_string()));
        }
        let mut late_seen = 0;
        for (lines, late, me) in &calls {
            let record = inv.record(me).await;
            let logs: Vec<&str> = record["logs"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
            let (own, others): (Vec<&str>, Vec<&str>) = logs.iter().partition(|l| l.ends_with(&format!(" {me}")));
            let late_lines: Vec<&&str> = others.iter().filter(|l| l.contains(" late ")).collect();
            late_seen += late_lines.len();
            assert_eq!(
                own.len(),
                lines * per_line,
                "{name}: {me} holds its own lines: {:?}",
                &logs[..logs.len().min(5)]
            );
            assert_eq!(others.len(), late_lines.len(), "{name}: {me}: no other call's line but a late one: {others:?}");
            if *late {
                assert!(!own.iter().any(|l| l.contains(" late ")), "{name}: written after the answer: not its own");
            }
        }
        if name == "f" && late_seen == 0 {
            // Written 0.2 s after its answer, with no call running: the next call's.
            let late = format!("late {}", calls[3].2);
            super::eventually(Duration::from_secs(10), "the late line in a later call's record", || async {
                let (_, answer) = inv.invoke("f", "blocking=true", json!({})).await;
                let record = inv.record(answer["activationId"].as_str().unwrap()).await;
                let logs = record["logs"].to_string();
                if logs.contains(&late) {
                    Ok(())
                } else {
                    Err(logs)
                }
            })
            .await;
        } else {
            assert!(late_seen <= 1, "{name}: the late line is in one record at most");
        }
    }
}
