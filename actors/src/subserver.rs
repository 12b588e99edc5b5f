//! The control side of a subserver: a ractor actor that owns the compute thread's
//! inbox and join handle. Admissions, releases, thresholds and stats go through it;
//! the hot path (handoffs between models) goes thread to thread.

use flume::Sender;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokenrouter_core::sched::{Arrival, BatchingRule, RequestId};

use crate::compute::{ComputeMsg, SubserverSnapshot};

pub enum SubserverMsg {
    Admit(Arrival),
    Release(RequestId),
    SetActive(usize),
    SetRule(BatchingRule),
    Stats(RpcReplyPort<Option<SubserverSnapshot>>),
    InjectPanic,
}

// Local only: ractor's `cluster` feature drops the blanket impl (see remote/).
impl ractor::Message for SubserverMsg {}

pub struct SubserverActor;

pub struct SubserverState {
    compute: Sender<ComputeMsg>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub struct SubserverArgs {
    pub(crate) compute: Sender<ComputeMsg>,
    pub(crate) thread: std::thread::JoinHandle<()>,
}

impl Actor for SubserverActor {
    type Msg = SubserverMsg;
    type State = SubserverState;
    type Arguments = SubserverArgs;

    async fn pre_start(
        &self,
        _: ActorRef<SubserverMsg>,
        args: SubserverArgs,
    ) -> Result<SubserverState, ActorProcessingErr> {
        Ok(SubserverState { compute: args.compute, thread: Some(args.thread) })
    }

    async fn handle(
        &self,
        _: ActorRef<SubserverMsg>,
        msg: SubserverMsg,
        state: &mut SubserverState,
    ) -> Result<(), ActorProcessingErr> {
        let forward = match msg {
            SubserverMsg::Admit(a) => ComputeMsg::Arrive(a),
            SubserverMsg::Release(id) => ComputeMsg::Release(id),
            SubserverMsg::SetActive(n) => ComputeMsg::SetActive(n),
            SubserverMsg::SetRule(rule) => ComputeMsg::SetRule(rule),
            SubserverMsg::InjectPanic => ComputeMsg::InjectPanic,
            SubserverMsg::Stats(reply) => {
                let (tx, rx) = flume::bounded(1);
                let snapshot = match state.compute.send_async(ComputeMsg::Stats(tx)).await {
                    Ok(()) => rx.recv_async().await.ok(),
                    Err(_) => None,
                };
                let _ = reply.send(snapshot);
                return Ok(());
            }
        };
        // The compute inbox is bounded; waiting here applies back-pressure to callers.
        state.compute.send_async(forward).await.map_err(|_| "compute thread is gone")?;
        Ok(())
    }

    async fn post_stop(&self, _: ActorRef<SubserverMsg>, state: &mut SubserverState) -> Result<(), ActorProcessingErr> {
        let _ = state.compute.send(ComputeMsg::Shutdown);
        if let Some(thread) = state.thread.take() {
            // Joining blocks: do it off the async workers.
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        Ok(())
    }
}
