//! The two actors' message types. Each has one variant that may cross hosts, `Frame`
//! (bytes in our own versioned format, see `wire`); every other variant is local and
//! is refused if it were ever addressed to a remote actor.

use ractor::message::{BoxedDowncastErr, SerializedMessage};
use tokenrouter_core::sched::{Arrival, RequestEvent};

use crate::messages::ComputeMsg;

/// The front's link to one remote model.
pub(crate) enum LinkMsg {
    /// From the node.
    Frame(Vec<u8>),
    /// From the engine: what the model's compute thread would have received.
    Outbound(ComputeMsg),
    /// Dialing number `.0` ended: the node's endpoint and the address it answered on.
    Connected(u64, Result<(ractor::ActorRef<NodeMsg>, String), String>),
    /// Heartbeat timer.
    Tick,
    /// No replacement came within the resume time after loss number `.0`.
    ResumeDeadline(u64),
}

/// The node's endpoint: frames from fronts, and what its compute threads produce.
pub(crate) enum NodeMsg {
    Frame(Vec<u8>),
    /// An event of a request on hosted model `.0`.
    Event(usize, RequestEvent),
    /// A request leaving hosted model `from` for model `to` (through the front).
    Handoff {
        from: usize,
        to: usize,
        arrival: Arrival,
    },
    /// Timer: look for fronts that left.
    Tick,
}

/// `ractor::Message` for a type with a `Frame(Vec<u8>)` variant: that variant is cast
/// as raw bytes to remote actors; the others stay local.
macro_rules! frame_message {
    ($t:ident) => {
        impl ractor::Message for $t {
            fn serializable() -> bool {
                true
            }

            fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
                match self {
                    $t::Frame(args) => Ok(SerializedMessage::Cast { variant: String::new(), args, metadata: None }),
                    _ => Err(BoxedDowncastErr),
                }
            }

            fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
                match message {
                    SerializedMessage::Cast { args, .. } => Ok($t::Frame(args)),
                    _ => Err(BoxedDowncastErr),
                }
            }
        }
    };
}

frame_message!(LinkMsg);
frame_message!(NodeMsg);
