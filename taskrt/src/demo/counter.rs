//! The keyed counting operator: keyed value state `count` per key; for every input record it
//! emits `(key, count, seq)` where `seq` is carried from the input.

use crate::exchange::Record;
use crate::operator::{Operator, OperatorContext, OperatorError};

pub const COUNT_STATE: &str = "count";

pub struct KeyedCounter;

impl Operator for KeyedCounter {
    fn process_record(&mut self, record: Record, ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        let keyed = ctx.keyed();
        let count = keyed.value_u64(COUNT_STATE, record.key)?.unwrap_or(0) + 1;
        keyed.put_value_u64(COUNT_STATE, record.key, count)?;
        ctx.emit(Record { key: record.key, value: count, seq: record.seq });
        Ok(())
    }
}
