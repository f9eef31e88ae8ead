fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find(|l| l.starts_with("VmRSS:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}
#[test]
fn probe() {
    let n: usize = std::env::var("N").map(|s| s.parse().unwrap()).unwrap_or(10_000);
    let c = dlock::Client::connect(dlock::ClientConfig::embedded_in(dlock::MemoryService::new())).unwrap();
    let warm = c.lock("warm").unwrap();
    warm.acquire(std::time::Duration::from_secs(5)).unwrap();
    let before = rss_kib();
    let t = std::time::Instant::now();
    let locks: Vec<_> = (0..n).map(|i| c.lock(&format!("probe/{i}")).unwrap()).collect();
    for l in &locks { l.acquire(std::time::Duration::from_secs(5)).unwrap(); }
    let el = t.elapsed();
    let after = rss_kib();
    println!("{n} locks: {:?}, {} B/lock", el, (after - before) * 1024 / n as u64);
    let t = std::time::Instant::now();
    drop(locks);
    println!("drop: {:?}", t.elapsed());
}
