//! From an admitted reservation to a running request, and the client's handle on it.
//! A request's cancellation must never be lost between the two: the stream and the
//! launch meet under one lock ([`StreamLink`]), so a client that leaves before, during
//! or after the launch cancels the request exactly once.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use ractor::{Actor, ActorRef};
use tokenrouter_core::sched::request::admit;
use tokenrouter_core::sched::{RequestId, RequestSpec};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::EngineError;
use crate::events::GenerationEvent;
use crate::handles::EngineLinks;
use crate::messages::RequestMsg;
use crate::request::{RequestActor, RequestArgs, RequestCore, Reservation};

#[derive(Default)]
struct LinkState {
    actor: Option<ActorRef<RequestMsg>>,
    /// The client dropped its stream before the request ended.
    cancelled: bool,
    /// The stream delivered the request's last event.
    ended: bool,
}

/// Where the client's stream and the request's actor meet.
#[derive(Clone, Default)]
pub(crate) struct StreamLink(Arc<parking_lot::Mutex<LinkState>>);

impl StreamLink {
    pub fn new() -> Self {
        Self::default()
    }

    fn attach(&self, actor: ActorRef<RequestMsg>) {
        let mut state = self.0.lock();
        if state.cancelled {
            let _ = actor.send_message(RequestMsg::Cancel);
        }
        state.actor = Some(actor);
    }

    fn cancel(&self) {
        let mut state = self.0.lock();
        if state.ended || state.cancelled {
            return;
        }
        state.cancelled = true;
        if let Some(actor) = &state.actor {
            let _ = actor.send_message(RequestMsg::Cancel);
        }
    }

    fn ended(&self) {
        self.0.lock().ended = true;
    }
}

/// Test hook: how long a launch pauses after its request actor has started, widening
/// the window in which the request's deadline can strike before it is sent anywhere.
static LAUNCH_DELAY_US: AtomicU64 = AtomicU64::new(0);

#[cfg(feature = "test-hooks")]
pub fn set_launch_delay_for_tests(delay: Duration) {
    LAUNCH_DELAY_US.store(delay.as_micros() as u64, Ordering::Relaxed);
}

/// Everything needed to start a request once it holds its KV reservation.
pub(crate) struct Launch {
    pub links: Arc<EngineLinks>,
    pub root: ActorRef<()>,
    pub core: RequestCore,
    pub spec: Arc<RequestSpec>,
    pub reservation: Reservation,
    pub submitted: Instant,
    pub deadline: Option<Duration>,
    pub link: StreamLink,
}

impl Launch {
    /// Spawns the request actor, registers it, and sends the request to its entry model.
    pub async fn run(self) -> Result<(), EngineError> {
        let Launch { links, root, core, spec, reservation, submitted, deadline, link } = self;
        // The actor registers itself and takes the reservation before it handles any
        // message, so nothing (its deadline included) can release it unregistered.
        let args = RequestArgs { core, links: links.clone(), reservation, submitted, deadline };
        let (actor, _) = Actor::spawn_linked(None, RequestActor, args, root.get_cell())
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let delay = LAUNCH_DELAY_US.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
        }
        let (entry, arrival) = admit(spec, links.model_count());
        if let Err(e) = links.deliver(entry, arrival) {
            let _ = actor.send_message(RequestMsg::Abort(e));
        }
        link.attach(actor);
        Ok(())
    }
}

/// The events of one request. Dropping it before the end cancels the request.
pub struct GenerationStream {
    events: UnboundedReceiver<GenerationEvent>,
    link: StreamLink,
    id: RequestId,
}

impl GenerationStream {
    pub(crate) fn new(events: UnboundedReceiver<GenerationEvent>, link: StreamLink, id: RequestId) -> Self {
        GenerationStream { events, link, id }
    }

    pub fn request_id(&self) -> RequestId {
        self.id
    }
}

impl Stream for GenerationStream {
    type Item = GenerationEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<GenerationEvent>> {
        let poll = self.events.poll_recv(cx);
        if let Poll::Ready(Some(GenerationEvent::Finished { .. } | GenerationEvent::Error { .. })) = &poll {
            self.link.ended(); // nothing to cancel on drop
        }
        poll
    }
}

impl Drop for GenerationStream {
    fn drop(&mut self) {
        self.link.cancel();
    }
}
