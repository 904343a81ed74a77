//! The Kubernetes factory's parts against the fake API server (`support::kube_api`), which
//! speaks the real REST and watch wire format: what each node offers, kept current by watches.
//! No Kubernetes cluster can run here; see docs/backends.md for what was tested only against the fake.

mod support;

use invoker_kubernetes::offers::NodeOffer;
use invoker_kubernetes::watch::{watch_cluster, watch_offers};
use invoker_kubernetes::{k8s_openapi, kube};
use std::time::Duration;
use support::kube_api::FakeApiServer;
use tokio::sync::watch;

async fn client(api: &FakeApiServer) -> kube::Client {
    let config = kube::Config::new(api.url.parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// Waits (bounded) until the offers satisfy `check`; returns them.
async fn until(
    offers: &mut watch::Receiver<Vec<NodeOffer>>,
    what: &str,
    check: impl Fn(&[NodeOffer]) -> bool,
) -> Vec<NodeOffer> {
    let waited = tokio::time::timeout(Duration::from_secs(20), offers.wait_for(|o| check(o))).await;
    let seen = waited.ok().and_then(|r| r.ok()).map(|seen| seen.clone());
    seen.unwrap_or_else(|| panic!("{what}: the offers never got there: {:?}", *offers.borrow()))
}

fn free(offers: &[NodeOffer], node: &str) -> Option<u64> {
    offers.iter().find(|o| o.node == node).map(|o| o.free_mb)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nodes_offer_follows_other_tenants_pods_cordon_and_readiness() {
    let api = FakeApiServer::start().await;
    api.add_node("n1", 4096);
    api.add_node("n2", 2048);
    api.add_pod("other-tenant", "db", "n1", 1024);
    let mut offers = watch_offers(client(&api).await, Vec::new());
    let seen =
        until(&mut offers, "the first lists", |o| free(o, "n1") == Some(3072) && free(o, "n2") == Some(2048)).await;
    assert!(seen.iter().all(|o| o.closed.is_none()), "{seen:?}");

    api.add_pod("other-tenant", "cache", "n2", 512);
    until(&mut offers, "another tenant's pod", |o| free(o, "n2") == Some(1536)).await;
    api.delete_pod("other-tenant", "db");
    until(&mut offers, "a pod deleted", |o| free(o, "n1") == Some(4096)).await;

    api.cordon("n1", true);
    let seen = until(&mut offers, "a cordon", |o| free(o, "n1") == Some(0)).await;
    let n1 = seen.iter().find(|o| o.node == "n1").unwrap();
    assert_eq!((n1.capacity_mb, n1.closed.as_deref()), (4096, Some("cordoned")), "capacity stays known");
    api.cordon("n1", false);
    until(&mut offers, "uncordoned", |o| free(o, "n1") == Some(4096)).await;

    api.set_ready("n2", false);
    until(&mut offers, "NotReady", |o| free(o, "n2") == Some(0)).await;
    api.set_ready("n2", true);
    until(&mut offers, "Ready again", |o| free(o, "n2") == Some(1536)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_watch_resumes_and_a_compacted_history_relists() {
    let api = FakeApiServer::start().await;
    api.add_node("n1", 4096);
    let mut offers = watch_offers(client(&api).await, Vec::new());
    until(&mut offers, "the first list", |o| free(o, "n1") == Some(4096)).await;
    // Both watchers (Nodes, Pods) have listed and are watching.
    support::eventually(Duration::from_secs(20), "the watches started", || {
        std::future::ready(if api.served().1 >= 2 { Ok(()) } else { Err(format!("{:?}", api.served())) })
    })
    .await;
    let (lists, watches, _) = api.served();
    assert_eq!(lists, 2, "one list of each");

    // Every watch ends (an API server restart); both are resumed, and a change made then
    // arrives on the resumed one, with no new list.
    api.drop_watches();
    support::eventually(Duration::from_secs(20), "the watches resumed", || {
        std::future::ready(if api.served().1 >= watches + 2 { Ok(()) } else { Err(format!("{:?}", api.served())) })
    })
    .await;
    api.add_pod("t", "a", "n1", 1024);
    until(&mut offers, "a change on a resumed watch", |o| free(o, "n1") == Some(3072)).await;
    assert_eq!(api.served().0, lists, "resumed from where they were, without a list");

    // The server goes down; meanwhile the cluster changes and the history is compacted away:
    // resuming from the old version gets 410, and the watcher lists again.
    api.set_down(true);
    api.add_node("n2", 1024);
    api.add_pod("t", "b", "n1", 1024);
    api.compact();
    api.set_down(false);
    until(&mut offers, "a relist after 410", |o| free(o, "n1") == Some(2048) && free(o, "n2") == Some(1024)).await;
    let (relists, _, expired) = api.served();
    assert!(expired >= 1 && relists > lists, "the resumed watch got 410 and the watcher listed again");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fake_answers_a_name_clash_with_409_and_an_invalid_pod_with_422_as_a_real_server() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    let api = FakeApiServer::start().await;
    let pods: kube::Api<Pod> = kube::Api::namespaced(client(&api).await, "ns");
    let pod = |name: &str, image: &str| -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": image}]}}))
        .unwrap()
    };
    let code = |r: Result<Pod, kube::Error>| match r {
        Err(kube::Error::Api(e)) => (e.code, e.reason),
        other => panic!("{other:?}"),
    };
    pods.create(&PostParams::default(), &pod("a", "busybox")).await.unwrap();
    assert_eq!(code(pods.create(&PostParams::default(), &pod("a", "busybox")).await), (409, "AlreadyExists".into()));
    assert_eq!(code(pods.create(&PostParams::default(), &pod("Not_A_Name", "busybox")).await), (422, "Invalid".into()));
    assert_eq!(code(pods.create(&PostParams::default(), &pod("b", "")).await), (422, "Invalid".into()));
    assert_eq!(api.pods("ns").len(), 1, "nothing made of the refused ones");
}

/// Once the view shows a pod, every offer stamped after counts it. A creation reads its pod's
/// readiness from the view, and the pool takes node stats stamped after a readiness to count
/// that pod; before, a change reached the store before the offers, stats stamped in between
/// showed a Ready pod's memory free, and a burst under load got a pod refused by the kubelet
/// (`kubernetes_pods.rs`, the burst).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_the_view_shows_is_counted_by_every_offer_stamped_after() {
    const PODS: u64 = 300;
    let api = FakeApiServer::start().await;
    api.add_node("n1", 1_000_000);
    let view = watch_cluster(client(&api).await, Vec::new());
    let mut offers = view.offers.clone();
    until(&mut offers, "the first lists", |o| free(o, "n1") == Some(1_000_000)).await;
    let reader = tokio::spawn({
        let view = view.clone();
        async move {
            for i in 0..PODS {
                while view.pod("tenant", &format!("p{i}")).is_none() {
                    tokio::task::yield_now().await;
                }
                let (offers, ()) = view.offers_stamped(|| ());
                let left = free(&offers, "n1").unwrap();
                assert!(left <= 1_000_000 - (i + 1), "p{i} is in the view, and the offers say {left} MB free");
            }
        }
    });
    for i in 0..PODS {
        api.add_pod("tenant", &format!("p{i}"), "n1", 1);
    }
    tokio::time::timeout(Duration::from_secs(60), reader).await.expect("every pod seen").unwrap();
}
