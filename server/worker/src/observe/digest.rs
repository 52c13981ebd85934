//! `files.read`'s SHA-256 (`end.sha256`), begun on a thread of its own while the capture is
//! read. Before `begin` only the capture runs and the other core waits; during the stream
//! every core is busy relaying. So each captured block is copied, still in the cache, into
//! one of a few reused slots and hashed beside the capture; the part the hashing thread did
//! not get to (no free slot: the capture never waits for it) is hashed as it goes out.
//! Either way the digest is of the captured bytes, in order.

use std::sync::mpsc;

use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

/// Blocks in flight to the hashing thread at most (each one a capture block).
const SLOTS: usize = 4;
/// Smaller files are hashed as they go out: a thread would cost more than it saves.
const SIDE_MIN: usize = 1 << 20;

/// The capture's side: hands blocks to the hashing thread while it keeps up.
pub(super) struct Feeder {
    /// None once a block was not handed over: the rest is hashed as it goes out.
    to: Option<mpsc::SyncSender<Vec<u8>>>,
    /// Slots the hashing thread is done with.
    back: mpsc::Receiver<Vec<u8>>,
    made: usize,
    fed: usize,
    result: oneshot::Receiver<Sha256>,
}

impl Feeder {
    /// Start a hashing thread on the runtime's blocking pool for a capture of `len` bytes
    /// (none for a small one, or outside a runtime: then everything is hashed as it goes
    /// out).
    pub(super) fn start(len: usize) -> Self {
        let (to, blocks) = mpsc::sync_channel::<Vec<u8>>(SLOTS);
        let (give_back, back) = mpsc::sync_channel(SLOTS);
        let (done, result) = oneshot::channel();
        let runtime = tokio::runtime::Handle::try_current().ok().filter(|_| len >= SIDE_MIN);
        let to = runtime.map(|rt| {
            rt.spawn_blocking(move || {
                let mut sha = Sha256::new();
                // Ends when the feeder is done or dropped.
                for block in blocks {
                    sha.update(&block);
                    let _ = give_back.try_send(block);
                }
                let _ = done.send(sha);
            });
            to
        });
        Self {
            to,
            back,
            made: 0,
            fed: 0,
            result,
        }
    }

    /// Offer the capture's next `block`, which starts at `at`: copied into a free slot for
    /// the hashing thread, or, when none is free, left (with every later block) to be
    /// hashed as it goes out.
    pub(super) fn feed(&mut self, at: usize, block: &[u8]) {
        let Some(to) = &self.to else { return };
        let slot = match self.back.try_recv() {
            Ok(slot) => Some(slot),
            Err(_) if self.made < SLOTS => {
                self.made += 1;
                Some(Vec::with_capacity(block.len()))
            }
            Err(_) => None,
        };
        let sent = slot.filter(|_| at == self.fed).is_some_and(|mut slot| {
            slot.clear();
            slot.extend_from_slice(block);
            // Never full: there are no more slots than its room.
            to.try_send(slot).is_ok()
        });
        if sent {
            self.fed += block.len();
        } else {
            self.to = None;
        }
    }

    /// No more blocks: the hashing thread finishes what it holds.
    pub(super) fn finish(self) -> RunDigest {
        RunDigest {
            side: Some(self.result),
            fed: self.fed,
            sha: Sha256::new(),
            hashed: 0,
        }
    }
}

/// The SHA-256 of a capture as its runs go out ([`RunDigest::upto`]).
pub(super) struct RunDigest {
    /// The hashing thread's state once it is done with the first `fed` bytes; None once
    /// taken over.
    side: Option<oneshot::Receiver<Sha256>>,
    fed: usize,
    /// The first `hashed` bytes.
    sha: Sha256,
    hashed: usize,
}

impl RunDigest {
    /// Hash `data` up to `end` (what has gone out so far), taking over from the hashing
    /// thread once the stream passes what it was given.
    pub(super) async fn upto(&mut self, data: &[u8], end: usize) {
        if self.side.is_some() && end <= self.fed {
            return;
        }
        self.take_over().await;
        if end > self.hashed {
            self.sha.update(&data[self.hashed..end]);
            self.hashed = end;
        }
    }

    /// The hashing thread's state, or (it never ran, or died) a start from the first byte.
    async fn take_over(&mut self) {
        if let Some(side) = self.side.take()
            && let Ok(sha) = side.await
        {
            self.sha = sha;
            self.hashed = self.fed;
        }
    }

    /// The digest of all of `data`.
    pub(super) async fn finish(mut self, data: &[u8]) -> [u8; 32] {
        self.take_over().await;
        self.upto(data, data.len()).await;
        self.sha.finalize().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `files.read` does with a capture of `blocks`: each offered as it is read, then
    /// hashed in runs of `run` bytes as they go out.
    async fn digest_of(mut feeder: Feeder, blocks: &[&[u8]], run: usize) -> [u8; 32] {
        let mut data = Vec::new();
        for block in blocks {
            feeder.feed(data.len(), block);
            data.extend_from_slice(block);
        }
        let mut digest = feeder.finish();
        let mut end = 0;
        while end < data.len() {
            end = (end + run).min(data.len());
            digest.upto(&data, end).await;
        }
        digest.finish(&data).await
    }

    #[tokio::test]
    async fn the_digest_is_of_the_whole_capture_however_much_the_side_thread_got() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let expected: [u8; 32] = Sha256::digest(&data).into();
        let blocks: Vec<&[u8]> = data.chunks(128 << 10).collect();
        // More blocks than slots: how many the thread gets depends on its pace.
        for run in [1, 1000, 256 << 10, 8 << 20] {
            assert_eq!(
                digest_of(Feeder::start(data.len()), &blocks, run).await,
                expected,
                "runs of {run}"
            );
        }
        // A block out of order stops the feeding; the rest is hashed as it goes out.
        let mut feeder = Feeder::start(data.len());
        feeder.feed(0, blocks[0]);
        feeder.feed(1, blocks[1]);
        assert_eq!(feeder.fed, blocks[0].len());
        assert!(feeder.to.is_none());
        let mut digest = feeder.finish();
        digest.upto(&data, 10).await;
        assert_eq!(digest.finish(&data).await, expected);
        // Nothing captured.
        assert_eq!(
            digest_of(Feeder::start(0), &[], 10).await,
            <[u8; 32]>::from(Sha256::digest(b""))
        );
    }

    #[tokio::test]
    async fn a_small_file_has_no_hashing_thread() {
        assert!(Feeder::start(SIDE_MIN - 1).to.is_none());
        assert!(Feeder::start(SIDE_MIN).to.is_some());
    }

    #[test]
    fn outside_a_runtime_everything_is_hashed_as_it_goes_out() {
        let data = vec![b'x'; 2 << 20];
        let feeder = Feeder::start(data.len());
        assert!(feeder.to.is_none());
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let got = rt.block_on(digest_of(feeder, &[&data[..100], &data[100..]], 4096));
        assert_eq!(got, <[u8; 32]>::from(Sha256::digest(&data)));
    }
}
