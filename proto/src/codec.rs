//! The protobuf codec of every Cairn service: prost's, except that a message that cannot be
//! decoded is the caller's fault, `INVALID_ARGUMENT` (tonic's own codec answers `INTERNAL`, which
//! tells a client to retry and an operator to look for a server bug).

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// prost encoding and decoding; decoding errors are `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder { inner: ProstCodec::<T, U>::default().decoder() }
    }
}

/// prost's decoder with decoding errors reported as `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct StrictDecoder<U> {
    inner: ProstDecoder<U>,
}

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.inner.decode(buf).map_err(|s| {
            Status::invalid_argument(format!(
                "the message is not a valid {} (protobuf): {}",
                std::any::type_name::<U>().rsplit("::").next().unwrap_or("message"),
                s.message()
            ))
        })
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.inner.buffer_settings()
    }
}
