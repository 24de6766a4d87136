//! Deterministic, resumable sample order: epoch e visits a Fisher-Yates permutation seeded by
//! (seed, e); the stream position (epoch, index) is all a checkpoint needs to restart it.

use serde::{Deserialize, Serialize};

/// The workspace's one generator; re-exported here because shuffling and synthesis use it.
pub use cannon_runtime::rng::SplitMix64;

/// Where the stream stands: the next sample is `order(epoch)[index]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub epoch: u64,
    pub index: usize,
}

/// The permutation of 0..n for one epoch.
pub fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0xd6e8_feb8_6659_fd93));
    // Burn one value so that nearby (seed, epoch) pairs do not start alike.
    rng.next_u64();
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

/// An endless stream of sample indices over epochs, restartable at any [`Position`].
#[derive(Debug, Clone)]
pub struct Shuffler {
    n: usize,
    seed: u64,
    pos: Position,
    order: Vec<usize>,
}

impl Shuffler {
    /// Starts at `pos` (Position::default() for a fresh run).
    pub fn new(n: usize, seed: u64, pos: Position) -> Self {
        let mut s = Shuffler {
            n,
            seed,
            pos,
            order: epoch_order(n, seed, pos.epoch),
        };
        s.normalise();
        s
    }

    fn normalise(&mut self) {
        if self.n > 0 && self.pos.index >= self.n {
            self.pos = Position {
                epoch: self.pos.epoch + 1,
                index: 0,
            };
            self.order = epoch_order(self.n, self.seed, self.pos.epoch);
        }
    }

    pub fn position(&self) -> Position {
        self.pos
    }

    /// The next sample index without consuming it; None for an empty dataset.
    pub fn peek(&self) -> Option<usize> {
        self.order.get(self.pos.index).copied()
    }
}

impl Iterator for Shuffler {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let i = self.peek()?;
        self.pos.index += 1;
        self.normalise();
        Some(i)
    }
}
