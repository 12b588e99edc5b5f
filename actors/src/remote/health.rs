//! Whether a remote node is alive, as a plain state machine: the link actor feeds it
//! what it hears and its heartbeat ticks, and acts on the verdicts.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    /// Connecting for the first time (the engine waits).
    Connecting,
    Up,
    /// Lost; looking for a replacement. Requests it held wait until `resume_timeout`.
    Down,
    /// Lost and no replacement in time: its requests ended with an error, new ones
    /// fail at once; reconnection goes on in the background.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickVerdict {
    Nothing,
    Ping(u64),
    Lost,
}

pub(crate) struct Health {
    pub state: LinkState,
    last_heard: Instant,
    loss_timeout: Duration,
    next_nonce: u64,
    /// Pings in flight: (nonce, sent at); old ones fall off.
    pings: VecDeque<(u64, Instant)>,
}

impl Health {
    pub fn new(loss_timeout: Duration, now: Instant) -> Self {
        Health { state: LinkState::Connecting, last_heard: now, loss_timeout, next_nonce: 1, pings: VecDeque::new() }
    }

    pub fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    pub fn up(&mut self, now: Instant) {
        self.state = LinkState::Up;
        self.last_heard = now;
        self.pings.clear();
    }

    /// A heartbeat: ping a live node, or declare it lost after `loss_timeout` of silence.
    pub fn tick(&mut self, now: Instant) -> TickVerdict {
        if self.state != LinkState::Up {
            return TickVerdict::Nothing;
        }
        if now.duration_since(self.last_heard) >= self.loss_timeout {
            return TickVerdict::Lost;
        }
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        self.pings.push_back((nonce, now));
        if self.pings.len() > 64 {
            self.pings.pop_front();
        }
        TickVerdict::Ping(nonce)
    }

    /// The round trip of a ping, if it is one we sent.
    pub fn pong(&mut self, nonce: u64, now: Instant) -> Option<Duration> {
        let at = self.pings.iter().position(|(n, _)| *n == nonce)?;
        let (_, sent) = self.pings.remove(at)?;
        Some(now.duration_since(sent))
    }

    /// Returns false when the node was not up (already handled).
    pub fn lost(&mut self) -> bool {
        let was_up = self.state == LinkState::Up;
        if was_up {
            self.state = LinkState::Down;
        }
        was_up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_longer_than_the_loss_timeout_is_a_loss() {
        let t0 = Instant::now();
        let mut h = Health::new(Duration::from_millis(500), t0);
        assert_eq!(h.tick(t0), TickVerdict::Nothing, "no verdicts while connecting");
        h.up(t0);
        let TickVerdict::Ping(n) = h.tick(t0 + Duration::from_millis(100)) else { panic!("expected a ping") };
        assert_eq!(h.pong(n, t0 + Duration::from_millis(103)), Some(Duration::from_millis(3)));
        assert_eq!(h.pong(n, t0 + Duration::from_millis(104)), None, "a pong counts once");
        h.heard(t0 + Duration::from_millis(400));
        assert!(matches!(h.tick(t0 + Duration::from_millis(800)), TickVerdict::Ping(_)));
        assert_eq!(h.tick(t0 + Duration::from_millis(900)), TickVerdict::Lost);
        assert!(h.lost());
        assert!(!h.lost(), "a loss is handled once");
        assert_eq!(h.state, LinkState::Down);
        assert_eq!(h.tick(t0 + Duration::from_secs(5)), TickVerdict::Nothing);
    }
}
