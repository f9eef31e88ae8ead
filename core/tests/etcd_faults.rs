//! Fault cases of the etcd backend against the real test cluster
//! (`scripts/test-etcd.sh`).

#[path = "common/etcd.rs"]
mod etcd_cluster;

#[test]
fn cluster_env_and_etcdctl() {
    let Some(cluster) = etcd_cluster::cluster() else {
        return;
    };
    cluster.etcdctl(&["put", "dlock-test/smoke", "1"]);
    assert!(cluster.etcdctl(&["get", "dlock-test/smoke"]).contains('1'));
    cluster.etcdctl_tls(&["put", "dlock-test/smoke", "1"]);
    assert!(cluster.leader() < 3);
    let _ = cluster.member_addr(0);
}
