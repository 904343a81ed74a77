//! One key of etcd held by one live process: an invoker's registration, a scheduler's
//! presence, the capacity manager's leadership. Each claimed value names its process by this
//! machine's boot and its pid, so that a restart within the lease's TTL takes over what its
//! dead run left while a second live process with the same id is refused.

use crate::kv::{ClusterKv, LeaseId};

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "{what} id '{id}' is held by a live {what} (api {api}, pid {pid}); {what} ids must be unique: \
         choose another {flag}"
    )]
    IdTaken { what: &'static str, flag: &'static str, id: String, api: String, pid: u32 },
    #[error("etcd: {0}")]
    Etcd(String),
}

/// Who holds a claimed key: the fields every claimed value (an invoker's, a scheduler's) has.
#[derive(serde::Deserialize)]
struct Holder {
    #[serde(default)]
    api: String,
    boot_id: String,
    pid: u32,
}

/// Puts `value` (a record naming this process by `boot_id` and `pid`) at `key` under `lease`
/// unless a live process holds the key. One held by a dead process of this machine's boot (a
/// crash, then a restart within the lease's TTL) is taken over. `who` names the key in the
/// refusal: `(what, flag, id)`.
pub async fn claim_key<K: ClusterKv>(
    kv: &K,
    key: &str,
    value: &str,
    lease: LeaseId,
    who: (&'static str, &'static str, &str),
) -> Result<(), ClaimError> {
    let etcd = |e: K::Error| ClaimError::Etcd(e.to_string());
    let mine: Holder = serde_json::from_str(value).map_err(|e| ClaimError::Etcd(format!("the value to claim: {e}")))?;
    for _ in 0..2 {
        if kv.create(key, value, lease).await.map_err(etcd)? {
            return Ok(());
        }
        let Some((held, holder)) = kv.get(key).await.map_err(etcd)? else { continue };
        match serde_json::from_str::<Holder>(&held).ok() {
            Some(o) if o.boot_id == mine.boot_id && (o.pid == mine.pid || !process_alive(o.pid)) => {
                tracing::info!(pid = o.pid, %key, "taking over the registration a dead run left");
                let _ = kv.revoke(holder).await;
                let _ = kv.delete(key).await;
            }
            other => {
                let (api, pid) = other.map(|o| (o.api, o.pid)).unwrap_or_default();
                let (what, flag, id) = who;
                return Err(ClaimError::IdTaken { what, flag, id: id.to_string(), api, pid });
            }
        }
    }
    Err(ClaimError::Etcd("the key changed hands while it was claimed".into()))
}

fn process_alive(pid: u32) -> bool {
    pid != 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// This machine's boot: with a pid, it names one process of one boot of one machine.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}
