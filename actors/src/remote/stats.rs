//! Cross-host counters (messages, bytes; round trips are recorded by the link) and the
//! subserver snapshot as it crosses hosts.

use parking_lot::Mutex;
use serde_json::Value;
use tokenrouter_core::model::KvCapacity;

use super::NodeStatus;
use crate::messages::SubserverSnapshot;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    In,
    Out,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}

/// Counts one frame in the Prometheus counters and in the node's status.
pub(crate) fn record_frame(model: &str, direction: Direction, bytes: usize, status: &Mutex<NodeStatus>) {
    let labels = [("model", model.to_string()), ("direction", direction.label().to_string())];
    metrics::counter!("tokenrouter_cluster_messages_total", &labels).increment(1);
    metrics::counter!("tokenrouter_cluster_bytes_total", &labels).increment(bytes as u64);
    let mut s = status.lock();
    match direction {
        Direction::In => {
            s.messages_in += 1;
            s.bytes_in += bytes as u64;
        }
        Direction::Out => {
            s.messages_out += 1;
            s.bytes_out += bytes as u64;
        }
    }
}

/// The node's `SubserverSnapshot` (sent as its JSON serialization).
pub(crate) fn snapshot_from_json(bytes: &[u8]) -> Option<SubserverSnapshot> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let n = |v: &Value, key: &str| v.get(key).and_then(Value::as_u64).map(|x| x as usize);
    let kv = v.get("kv")?;
    Some(SubserverSnapshot {
        model: v.get("model")?.as_str()?.to_string(),
        ready: n(&v, "ready")?,
        pending: n(&v, "pending")?,
        threshold: n(&v, "threshold")?,
        kv: KvCapacity {
            block_size: n(kv, "block_size")?,
            total_blocks: n(kv, "total_blocks")?,
            free_blocks: n(kv, "free_blocks")?,
            cached_blocks: n(kv, "cached_blocks").unwrap_or(0),
            used_blocks: n(kv, "used_blocks").unwrap_or(0),
            shared_with: n(kv, "shared_with").unwrap_or(0),
        },
        stats: serde_json::from_value(v.get("stats")?.clone()).ok()?,
        restarts: v.get("restarts")?.as_u64()?,
        resumed: v.get("resumed").and_then(Value::as_u64).unwrap_or(0),
        failed: v.get("failed").and_then(Value::as_bool).unwrap_or(false),
        reloads: v.get("reloads").and_then(Value::as_u64).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_survives_the_trip() {
        let mut stats = tokenrouter_core::sched::SubserverStats::default();
        stats.steps = 12;
        stats.busy = std::time::Duration::from_millis(1500);
        stats.handoffs_to = vec![0, 3];
        let s = SubserverSnapshot {
            model: "large".into(),
            ready: 2,
            pending: 1,
            threshold: 4,
            kv: KvCapacity {
                block_size: 16,
                total_blocks: 100,
                free_blocks: 90,
                cached_blocks: 20,
                used_blocks: 10,
                shared_with: 1,
            },
            stats,
            restarts: 1,
            resumed: 2,
            failed: false,
            reloads: 3,
        };
        let back = snapshot_from_json(&serde_json::to_vec(&s).unwrap()).expect("parses");
        assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&s).unwrap());
        assert!(snapshot_from_json(b"{\"model\": 1}").is_none());
    }
}
