//! Decoding a [`Command`] tag first.
//!
//! serde's derive for an internally tagged enum (`#[serde(tag = "cmd")]`) cannot know where the
//! tag is, so it first buffers the whole map (every key, every value, every nested command of a
//! batch) and then decodes the variant from that buffer: at a thousand jobs that buffering was
//! the largest cost of a follower. Cairn always writes the tag first (serde's internally tagged
//! `Serialize` does), so this decoder reads the first key and, when it is `cmd`, decodes the
//! remaining entries straight into the named variant through [`Wire`], an externally tagged
//! twin of [`Command`]. A map whose tag is not first (written by hand, or by another encoder)
//! still decodes, through a buffer, as before.

use std::fmt;

use serde::de::{self, DeserializeSeed, EnumAccess, IntoDeserializer, MapAccess, VariantAccess, Visitor};
use serde::{Deserialize, Deserializer};

use cairn_protocol::restart::RestartStrategy;

use super::command::Command;
use super::{CheckpointConfig, CompletedCheckpoint, JobId, JobSpec, JobStatus, Outcome, SavepointRecord};

const TAG: &str = "cmd";

/// [`Command`] with the same variants and fields, externally tagged: its derived decoder takes
/// the variant name and then the fields as a map, which is what [`TaggedMap`] hands it.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Wire {
    RegisterJob { job: JobId, name: String, spec: JobSpec },
    UpdateJobConfig { job: JobId, checkpoint: CheckpointConfig },
    SetJobStatus { job: JobId, status: JobStatus },
    AllocateCheckpointId { job: JobId },
    ReserveCheckpointIds { job: JobId, count: u32 },
    AdvanceCheckpointCounter { job: JobId, next: u64 },
    AddCompletedCheckpoint { job: JobId, checkpoint: CompletedCheckpoint },
    RegisterSavepoint { job: JobId, savepoint: SavepointRecord },
    DisposeSavepoint { job: JobId, checkpoint_id: u64 },
    RemoveJob { job: JobId },
    DiscardRetainedCheckpoints { job: JobId },
    RecordStats { job: JobId, stats: serde_json::Value },
    RecordFailure { job: JobId, at_ms: u64, cause: String, strategy: RestartStrategy, jitter_permille: i16 },
    ReleaseRetainedCheckpoint { job: JobId, checkpoint_id: u64 },
    BeginAttempt { job: JobId },
    Deduplicated { request_id: String, fingerprint: u64, command: Box<Command> },
    RecordRequest { job: JobId, request_id: String, fingerprint: u64, outcome: Outcome },
    Batch { commands: Vec<Command> },
}

impl From<Wire> for Command {
    fn from(w: Wire) -> Self {
        match w {
            Wire::RegisterJob { job, name, spec } => Self::RegisterJob { job, name, spec },
            Wire::UpdateJobConfig { job, checkpoint } => Self::UpdateJobConfig { job, checkpoint },
            Wire::SetJobStatus { job, status } => Self::SetJobStatus { job, status },
            Wire::AllocateCheckpointId { job } => Self::AllocateCheckpointId { job },
            Wire::ReserveCheckpointIds { job, count } => Self::ReserveCheckpointIds { job, count },
            Wire::AdvanceCheckpointCounter { job, next } => Self::AdvanceCheckpointCounter { job, next },
            Wire::AddCompletedCheckpoint { job, checkpoint } => {
                Self::AddCompletedCheckpoint { job, checkpoint }
            }
            Wire::RegisterSavepoint { job, savepoint } => Self::RegisterSavepoint { job, savepoint },
            Wire::DisposeSavepoint { job, checkpoint_id } => Self::DisposeSavepoint { job, checkpoint_id },
            Wire::RemoveJob { job } => Self::RemoveJob { job },
            Wire::DiscardRetainedCheckpoints { job } => Self::DiscardRetainedCheckpoints { job },
            Wire::RecordStats { job, stats } => Self::RecordStats { job, stats },
            Wire::RecordFailure { job, at_ms, cause, strategy, jitter_permille } => {
                Self::RecordFailure { job, at_ms, cause, strategy, jitter_permille }
            }
            Wire::ReleaseRetainedCheckpoint { job, checkpoint_id } => {
                Self::ReleaseRetainedCheckpoint { job, checkpoint_id }
            }
            Wire::BeginAttempt { job } => Self::BeginAttempt { job },
            Wire::Deduplicated { request_id, fingerprint, command } => {
                Self::Deduplicated { request_id, fingerprint, command }
            }
            Wire::RecordRequest { job, request_id, fingerprint, outcome } => {
                Self::RecordRequest { job, request_id, fingerprint, outcome }
            }
            Wire::Batch { commands } => Self::Batch { commands },
        }
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(CommandVisitor)
    }
}

struct CommandVisitor;

impl<'de> Visitor<'de> for CommandVisitor {
    type Value = Command;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a command: a map whose `{TAG}` entry names it")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Command, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Err(de::Error::missing_field(TAG));
        };
        if first == TAG {
            let tag: String = map.next_value()?;
            return Wire::deserialize(TaggedMap { tag, map }).map(Command::from);
        }
        // The tag is not first: buffer the entries and find it.
        let mut entries = serde_json::Map::new();
        entries.insert(first, map.next_value()?);
        while let Some((key, value)) = map.next_entry::<String, serde_json::Value>()? {
            entries.insert(key, value);
        }
        let tag = match entries.remove(TAG) {
            Some(serde_json::Value::String(tag)) => tag,
            Some(other) => {
                return Err(de::Error::invalid_type(unexpected(&other), &"the command's name as a string"));
            }
            None => return Err(de::Error::missing_field(TAG)),
        };
        let external = serde_json::Value::Object(serde_json::Map::from_iter([(
            tag,
            serde_json::Value::Object(entries),
        )]));
        Wire::deserialize(external).map(Command::from).map_err(de::Error::custom)
    }
}

fn unexpected(v: &serde_json::Value) -> de::Unexpected<'_> {
    match v {
        serde_json::Value::Null => de::Unexpected::Unit,
        serde_json::Value::Bool(b) => de::Unexpected::Bool(*b),
        serde_json::Value::Number(_) => de::Unexpected::Other("a number"),
        serde_json::Value::String(s) => de::Unexpected::Str(s),
        serde_json::Value::Array(_) => de::Unexpected::Seq,
        serde_json::Value::Object(_) => de::Unexpected::Map,
    }
}

/// The rest of a command's map after its tag, presented as an externally tagged enum: the tag
/// is the variant, the remaining entries its fields.
struct TaggedMap<A> {
    tag: String,
    map: A,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for TaggedMap<A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

impl<'de, A: MapAccess<'de>> EnumAccess<'de> for TaggedMap<A> {
    type Error = A::Error;
    type Variant = Fields<A>;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Fields<A>), A::Error> {
        let variant = seed.deserialize(self.tag.into_deserializer())?;
        Ok((variant, Fields(self.map)))
    }
}

/// A variant's fields: the entries after the tag.
struct Fields<A>(A);

impl<'de, A: MapAccess<'de>> VariantAccess<'de> for Fields<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        Err(de::Error::invalid_type(de::Unexpected::UnitVariant, &"a command with fields"))
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value, A::Error> {
        Err(de::Error::invalid_type(de::Unexpected::NewtypeVariant, &"a command with fields"))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, A::Error> {
        Err(de::Error::invalid_type(de::Unexpected::TupleVariant, &"a command with fields"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_map(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CheckpointKind;

    fn job() -> JobId {
        JobId::new("j").unwrap()
    }

    fn every_command() -> Vec<Command> {
        let checkpoint = CompletedCheckpoint {
            id: 4,
            kind: CheckpointKind::Checkpoint,
            trigger_time_ms: 1,
            completion_time_ms: 2,
            metadata_path: "/cp/j/chk-4/_metadata".into(),
            metadata_size: 10,
            metadata_crc32: 7,
            state_size: 3,
        };
        let savepoint =
            SavepointRecord { checkpoint: checkpoint.clone(), path: "/sp/savepoint-j-4-1".into() };
        let single = vec![
            Command::RegisterJob { job: job(), name: "n".into(), spec: JobSpec::default() },
            Command::UpdateJobConfig { job: job(), checkpoint: CheckpointConfig::default() },
            Command::SetJobStatus { job: job(), status: JobStatus::Running },
            Command::AllocateCheckpointId { job: job() },
            Command::ReserveCheckpointIds { job: job(), count: 100 },
            Command::AdvanceCheckpointCounter { job: job(), next: 9 },
            Command::AddCompletedCheckpoint { job: job(), checkpoint },
            Command::RegisterSavepoint { job: job(), savepoint },
            Command::DisposeSavepoint { job: job(), checkpoint_id: 4 },
            Command::RemoveJob { job: job() },
            Command::DiscardRetainedCheckpoints { job: job() },
            Command::RecordStats { job: job(), stats: serde_json::json!({"counts": {"completed": 3}}) },
            Command::RecordFailure {
                job: job(),
                at_ms: 5,
                cause: "task failed".into(),
                strategy: RestartStrategy::exponential_delay(),
                jitter_permille: -3,
            },
            Command::ReleaseRetainedCheckpoint { job: job(), checkpoint_id: 4 },
            Command::BeginAttempt { job: job() },
            Command::Deduplicated {
                request_id: "r".into(),
                fingerprint: 11,
                command: Box::new(Command::AllocateCheckpointId { job: job() }),
            },
            Command::RecordRequest {
                job: job(),
                request_id: "r".into(),
                fingerprint: 11,
                outcome: Outcome::CheckpointId { id: 4 },
            },
        ];
        let mut all = single.clone();
        all.push(Command::Batch { commands: single });
        all
    }

    #[test]
    fn every_command_round_trips_through_json_and_messagepack() {
        for command in every_command() {
            let json = serde_json::to_vec(&command).unwrap();
            assert!(json.starts_with(b"{\"cmd\":"), "the tag is written first");
            assert_eq!(serde_json::from_slice::<Command>(&json).unwrap(), command);
            let packed = rmp_serde::to_vec_named(&command).unwrap();
            assert_eq!(rmp_serde::from_slice::<Command>(&packed).unwrap(), command);
        }
    }

    #[test]
    fn a_tag_that_is_not_first_still_decodes() {
        let text = r#"{"count": 5, "job": "j", "cmd": "reserve_checkpoint_ids"}"#;
        let command: Command = serde_json::from_str(text).unwrap();
        assert_eq!(command, Command::ReserveCheckpointIds { job: job(), count: 5 });
        let batch = r#"{"commands": [{"job": "j", "cmd": "begin_attempt"}], "cmd": "batch"}"#;
        let command: Command = serde_json::from_str(batch).unwrap();
        assert_eq!(command, Command::Batch { commands: vec![Command::BeginAttempt { job: job() }] });
    }

    #[test]
    fn bad_commands_are_refused_with_the_reason() {
        let err = |text: &str| serde_json::from_str::<Command>(text).unwrap_err().to_string();
        assert!(err("{}").contains("missing field `cmd`"));
        assert!(err(r#"{"job": "j"}"#).contains("missing field `cmd`"));
        assert!(err(r#"{"cmd": "explode", "job": "j"}"#).contains("unknown variant `explode`"));
        assert!(err(r#"{"job": "j", "cmd": 3}"#).contains("the command's name as a string"));
        assert!(err(r#"{"cmd": "reserve_checkpoint_ids", "job": "j"}"#).contains("missing field `count`"));
        assert!(err(r#"{"cmd": "begin_attempt", "job": 4}"#).contains("invalid type"));
        assert!(err(r#"["begin_attempt"]"#).contains("a command"));
        assert!(err(r#""begin_attempt""#).contains("a command"));
    }
}
