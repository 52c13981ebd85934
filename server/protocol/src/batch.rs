//! How a WebSocket writer (the API tier's to clients and workers, the worker's to the API
//! tier) sends what is queued: in batches, flushed once.

use futures_util::{Sink, SinkExt};

/// The most queued messages a WebSocket writer hands to the socket before it flushes.
pub const WRITE_BATCH: usize = 32;

/// Hand `first` and whatever `more` has queued now (up to [`WRITE_BATCH`] in all) to a
/// WebSocket, then flush once: a burst (a file's chunks, many turns' events) goes out in a
/// few large writes instead of a system call, and a wake-up of the peer, per message.
/// Nothing waits for more to arrive, so a lone message goes out as soon as it is queued.
/// True once a message `is_close` has been sent (nothing after it is taken).
pub async fn write_batch<S, M>(
    sink: &mut S,
    first: M,
    mut more: impl FnMut() -> Option<M>,
    is_close: impl Fn(&M) -> bool,
) -> Result<bool, S::Error>
where
    S: Sink<M> + Unpin,
{
    let mut next = Some(first);
    let mut sent = 0;
    while let Some(msg) = next.take() {
        let close = is_close(&msg);
        sink.feed(msg).await?;
        sent += 1;
        if close {
            sink.flush().await?;
            return Ok(true);
        }
        if sent < WRITE_BATCH {
            next = more();
        }
    }
    sink.flush().await?;
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::{
        collections::VecDeque,
        pin::Pin,
        task::{Context, Poll},
    };

    use super::*;

    /// A sink that records what it is handed and each flush.
    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl Sink<String> for Recorder {
        type Error = std::convert::Infallible;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn start_send(mut self: Pin<&mut Self>, item: String) -> Result<(), Self::Error> {
            self.0.push(item);
            Ok(())
        }
        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.0.push("flush".into());
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
    }

    fn close(m: &String) -> bool {
        m == "close"
    }

    #[tokio::test]
    async fn a_batch_is_what_is_queued_in_order_then_one_flush() {
        // A lone message: sent and flushed at once.
        let mut sink = Recorder::default();
        assert!(!write_batch(&mut sink, "0".to_string(), || None, close).await.unwrap());
        assert_eq!(sink.0, ["0", "flush"]);
        // A burst longer than a batch: the first WRITE_BATCH in order, one flush; the rest
        // stays queued for the next batch.
        let mut queue: VecDeque<String> = (1..=WRITE_BATCH + 5).map(|i| i.to_string()).collect();
        let mut sink = Recorder::default();
        assert!(
            !write_batch(&mut sink, "0".to_string(), || queue.pop_front(), close)
                .await
                .unwrap()
        );
        let expected: Vec<String> = (0..WRITE_BATCH)
            .map(|i| i.to_string())
            .chain(["flush".into()])
            .collect();
        assert_eq!(sink.0, expected);
        assert_eq!(queue.len(), 6);
        // A close ends the batch, flushed; nothing after it is taken.
        let mut queue: VecDeque<String> = ["1", "close", "2"].map(String::from).into();
        let mut sink = Recorder::default();
        assert!(
            write_batch(&mut sink, "0".to_string(), || queue.pop_front(), close)
                .await
                .unwrap()
        );
        assert_eq!(sink.0, ["0", "1", "close", "flush"]);
        assert_eq!(queue.len(), 1);
    }
}
