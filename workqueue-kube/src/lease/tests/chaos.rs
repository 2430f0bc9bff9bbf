//! Random faults against the Lease protocol: replicas killed, restarted, shut down, cut off
//! (blackholed or refused), slowed, an API server outage, controllers slow to acknowledge,
//! clocks off by up to half an hour and apart in rate by up to 2%; seeded, so each run is the
//! same. Throughout, no two replicas may believe they hold one shard at the same instant, and
//! once the faults stop the live replicas settle on a fair share.

use tokio::time::sleep;

use super::support::*;
use workqueue_test_support::apiserver::{ApiServer, Partition};

/// xorshift64*: a small deterministic generator (no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const REPLICAS: usize = 4;
const SHARDS: u32 = 8;

async fn chaos(seed: u64) -> (usize, u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let server = ApiServer::new();
    let ledger = Ledger::new();
    let names: Vec<String> = (0..REPLICAS).map(|i| format!("r{i}")).collect();
    let mut generation = vec![0u32; REPLICAS];
    // Whether slot i's last process is dead (crashed), so that a new one may reuse its identity.
    let mut dead = vec![false; REPLICAS];
    let new_replica = |rng: &mut Rng, i: usize, generation: &mut Vec<u32>, dead: &mut Vec<bool>| {
        generation[i] += 1;
        // A process restarted after a crash may keep its identity (a pod restarted in place);
        // otherwise it is a new pod with a new name.
        let identity = if dead[i] && rng.below(2) == 0 {
            names[i].clone()
        } else {
            format!("{}-{}", names[i], generation[i])
        };
        dead[i] = false;
        server.set_latency(&identity, millis(rng.below(200)), millis(rng.below(200)));
        let offset = rng.below(3600) as i64 - 1800;
        let rate = 0.99 + 0.02 * rng.unit();
        let controller = match rng.below(3) {
            0 => Controller::AcksAtOnce,
            1 => Controller::AcksAfter(millis(rng.below(4000))),
            _ => Controller::AcksAfter(millis(rng.below(300))),
        };
        start(
            &server,
            &ledger,
            config(&identity, SHARDS),
            clock(offset, rate),
            controller,
        )
    };
    let mut replicas: Vec<Option<Replica>> = (0..REPLICAS)
        .map(|i| Some(new_replica(&mut rng, i, &mut generation, &mut dead)))
        .collect();
    let mut faults = 0;
    for _ in 0..120 {
        sleep(millis(500 + rng.below(6000))).await;
        let i = rng.below(REPLICAS as u64) as usize;
        faults += 1;
        match rng.below(10) {
            0 => {
                if let Some(r) = replicas[i].take() {
                    if rng.below(2) == 0 {
                        r.kill();
                    } else {
                        r.crash();
                        dead[i] = true;
                    }
                }
            }
            1 => {
                if let Some(mut r) = replicas[i].take() {
                    r.shut_down();
                    // Shutting down in the background; a new process may start meanwhile.
                    tokio::spawn(async move {
                        let _ = (&mut r.task).await;
                    });
                }
            }
            2 | 3 if replicas[i].is_none() => {
                replicas[i] = Some(new_replica(&mut rng, i, &mut generation, &mut dead));
            }
            4 | 5 => {
                if let Some(r) = &replicas[i] {
                    let how = if rng.below(2) == 0 {
                        Partition::Blackholed
                    } else {
                        Partition::Refused
                    };
                    server.set_partition(&r.name, how);
                    let (server, name, heal) =
                        (server.clone(), r.name.clone(), millis(rng.below(30_000)));
                    tokio::spawn(async move {
                        sleep(heal).await;
                        server.set_partition(&name, Partition::Connected);
                    });
                }
            }
            6 => {
                if let Some(r) = &replicas[i] {
                    server.set_latency(&r.name, millis(rng.below(900)), millis(rng.below(900)));
                }
            }
            7 if rng.below(4) == 0 => {
                server.set_down(true);
                let (server, back) = (server.clone(), millis(rng.below(20_000)));
                tokio::spawn(async move {
                    sleep(back).await;
                    server.set_down(false);
                });
            }
            _ => {}
        }
    }
    // Calm: everything healed, every replica up, latency low.
    sleep(secs(30)).await;
    server.set_down(false);
    for (i, slot) in replicas.iter_mut().enumerate() {
        let r = slot.get_or_insert_with(|| new_replica(&mut rng, i, &mut generation, &mut dead));
        server.set_partition(&r.name, Partition::Connected);
        server.set_latency(&r.name, millis(5), millis(5));
    }
    let live: Vec<&Replica> = replicas.iter().flatten().collect();
    let settle = until(
        secs(120),
        "the live replicas settle after the faults",
        || settled(&live, SHARDS),
    )
    .await;
    let (beliefs, gap) = ledger.assert_never_two_at_once();
    println!(
        "seed {seed}: {faults} faults, {beliefs} beliefs, smallest gap {gap:?}, settled {settle:?} after the calm"
    );
    (beliefs, faults)
}

#[tokio::test(start_paused = true)]
async fn no_two_replicas_ever_hold_one_shard_under_random_faults() {
    let mut total = 0;
    for seed in 1..=10 {
        total += chaos(seed).await.0;
    }
    assert!(total > 200, "too few beliefs to mean anything: {total}");
}
