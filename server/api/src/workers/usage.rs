//! Usage the model proxy meters for a turn whose worker connection this replica holds: handed
//! to the turn's task and stored with the turn's next step, in the step's own statement,
//! instead of in a transaction of its own before the stream's end reaches the worker. A turn
//! held by another replica (or whose task has ended) is metered in the database directly
//! ([`berth_store::Store::meter_usage`]); nothing metered is dropped either way.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use berth_store::Metered;

/// One turn's metered calls not stored yet.
#[derive(Default)]
pub(super) struct UsageSlot(Mutex<SlotState>);

#[derive(Default)]
struct SlotState {
    /// The turn's task has ended: nothing more is taken here.
    closed: bool,
    calls: Vec<Metered>,
}

impl UsageSlot {
    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take a call's usage for the next step; given back when the slot is closed.
    fn offer(&self, m: Metered) -> Result<(), Metered> {
        let mut s = self.state();
        if s.closed {
            return Err(m);
        }
        s.calls.push(m);
        Ok(())
    }

    /// The usage for the step being stored.
    pub(super) fn take(&self) -> Vec<Metered> {
        std::mem::take(&mut self.state().calls)
    }

    /// Usage taken for a write that failed: kept for the next one (or the close).
    pub(super) fn restore(&self, mut taken: Vec<Metered>) {
        let mut s = self.state();
        taken.append(&mut s.calls);
        s.calls = taken;
    }

    /// The turn's task ends: what is left must be metered in the database.
    fn close(&self) -> Vec<Metered> {
        let mut s = self.state();
        s.closed = true;
        std::mem::take(&mut s.calls)
    }
}

/// The slots of the turns this replica's worker connections run, by turn id.
#[derive(Default)]
pub(super) struct Slots(Mutex<HashMap<String, Arc<UsageSlot>>>);

impl Slots {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<UsageSlot>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a turn handed to a connection of this replica.
    pub(super) fn open(&self, turn_id: &str) -> Arc<UsageSlot> {
        let slot = Arc::new(UsageSlot::default());
        self.map().insert(turn_id.to_string(), slot.clone());
        slot
    }

    /// The turn's task ends: its slot closes; returns what was never stored.
    pub(super) fn close(&self, turn_id: &str, slot: &Arc<UsageSlot>) -> Vec<Metered> {
        let mut map = self.map();
        if map.get(turn_id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            map.remove(turn_id);
        }
        drop(map);
        slot.close()
    }

    /// Hand a call's usage to the turn's task, if this replica runs the turn; else it is
    /// given back, for the database.
    pub(super) fn offer(&self, turn_id: &str, m: Metered) -> Result<(), Metered> {
        let slot = self.map().get(turn_id).cloned();
        match slot {
            Some(slot) => slot.offer(m),
            None => Err(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use berth_protocol::worker::Usage;

    use super::*;

    fn call(input: u64) -> Metered {
        Metered {
            context: Some(format!("ctx_{input}")),
            usage: Usage {
                input_tokens: input,
                output_tokens: 1,
            },
        }
    }

    #[test]
    fn usage_goes_to_the_running_turn_and_never_past_its_end() {
        let slots = Slots::default();
        assert!(slots.offer("trn_a", call(1)).is_err(), "no such turn here");
        let slot = slots.open("trn_a");
        slots.offer("trn_a", call(2)).expect("taken");
        let taken = slot.take();
        assert_eq!(taken.len(), 1);
        slots.offer("trn_a", call(3)).expect("taken");
        // A failed write gives its usage back, before what came since.
        slot.restore(taken);
        let inputs: Vec<u64> = slot.take().iter().map(|m| m.usage.input_tokens).collect();
        assert_eq!(inputs, [2, 3]);
        slots.offer("trn_a", call(4)).expect("taken");
        let left = slots.close("trn_a", &slot);
        assert_eq!(left.len(), 1, "what was never stored is returned at the close");
        assert!(slots.offer("trn_a", call(5)).is_err(), "closed: metered elsewhere");
        assert!(
            slot.offer(call(6)).is_err(),
            "a slot looked up before the close refuses too"
        );
    }
}
