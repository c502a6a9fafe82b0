//! The client on a Redis Cluster: the nodes in `REDIS_CLUSTER` (URLs separated by commas, default three local
//! nodes on ports 7000 to 7002); each user's two limits in one atomic call, the users spread over the slots.
//!
//!     REDIS_CLUSTER=redis://127.0.0.1:7000,redis://127.0.0.1:7001 cargo run -p redis-tb-client --example cluster
//!
//! docs/rust.md shows the part between the snippet markers.

// snippet: start
use std::time::Duration;

use redis_tb_client::cluster::key_slot;
use redis_tb_client::{BucketWithCost, Client};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = std::env::var("REDIS_CLUSTER").unwrap_or_else(|_| {
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002".to_owned()
    });
    // Some nodes of the cluster, as redis-rs's ClusterClient takes them: the others are found from them.
    let client = Client::cluster_builder(nodes.split(','))
        .timeout(Duration::from_millis(500))
        .build()?;
    for user in ["ann", "bob", "cy"] {
        // One hash tag per user: a user's buckets share a slot, so both go in one atomic call.
        let (second, day) = (format!("api:{{{user}}}:1s"), format!("api:{{{user}}}:1d"));
        for _ in 0..3 {
            let reply = client
                .acquire_each(&[
                    BucketWithCost {
                        key: &second,
                        rate: 1.0,
                        burst: 2.0,
                        cost: 1.0,
                    },
                    BucketWithCost {
                        key: &day,
                        rate: 0.01,
                        burst: 1000.0,
                        cost: 1.0,
                    },
                ])
                .await?;
            println!(
                "{user} (slot {}): allowed {}, left {:?}, retry after {} ms",
                key_slot(&second),
                reply.allowed,
                reply
                    .buckets
                    .iter()
                    .map(|bucket| bucket.remaining)
                    .collect::<Vec<_>>(),
                reply.retry_after_ms(),
            );
        }
    }
    println!("backend: {:?}", client.backend_in_use());
    Ok(())
}
// snippet: end
