//! The shared state of one group of in-process ranks: a round-based rendezvous in which every
//! rank posts its call (description + buffer addresses), then generation-counted stage barriers
//! inside the round, plus the point-to-point mailboxes.
//!
//! Round protocol (one round per collective, all ranks call collectives in the same order):
//! 1. `enter`: each rank posts into its slot. The last to post checks that all posts describe the
//!    same collective and publishes them as the running `Round`. Until then a waiting rank may
//!    give up (timeout, a dropped peer, a failure elsewhere): it withdraws its post under the
//!    lock, so no peer ever sees buffers of a rank that left.
//! 2. The ranks execute, separated by `stage` barriers; the final stage also resets the slots for
//!    the next round. Between `enter` and the final stage a rank cannot give up: peers may be
//!    reading its buffers, and every rank that posted is inside bounded, panic-free copy loops of
//!    this module, so those waits always end.
//!
//! Any failure poisons the group: every later call returns `CommError::Poisoned` naming the cause.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::super::error::CommError;
use super::bufs::RawBufs;
use super::desc::{check_match, OpDesc, OpKind};
use crate::dtype::DType;

/// One rank's posted call.
pub(super) struct Post {
    pub desc: OpDesc,
    pub bufs: RawBufs,
}

/// A collective whose posts all matched: what every rank executes.
pub(super) struct Round {
    pub posts: Vec<Post>,
    /// split: for each old rank, its new group and its rank in it.
    pub split_out: Vec<(Arc<Group>, usize)>,
}

/// A point-to-point message (sends are eager: copied at `send`, so rings cannot deadlock).
pub(super) struct Message {
    pub dtype: DType,
    pub len: usize,
    pub bytes: Vec<u8>,
}

struct Failure {
    /// The collective (by count) in which the failure happened, `None` for point-to-point.
    round: Option<u64>,
    error: CommError,
}

struct State {
    round: u64,
    posts: Vec<Option<Post>>,
    n_posted: usize,
    running: Option<Arc<Round>>,
    /// Arrivals at the current stage barrier and the number of completed stage barriers.
    stage_arrived: usize,
    stage_gen: u64,
    failure: Option<Failure>,
    dropped: Vec<bool>,
    /// `mailboxes[src * size + dst]`, FIFO: messages match in send order.
    mailboxes: Vec<VecDeque<Message>>,
}

pub(super) struct Group {
    size: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl Group {
    pub(super) fn new(size: usize) -> Arc<Group> {
        Arc::new(Group {
            size,
            state: Mutex::new(State {
                round: 0,
                posts: (0..size).map(|_| None).collect(),
                n_posted: 0,
                running: None,
                stage_arrived: 0,
                stage_gen: 0,
                failure: None,
                dropped: vec![false; size],
                mailboxes: (0..size * size).map(|_| VecDeque::new()).collect(),
            }),
            cv: Condvar::new(),
        })
    }

    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// Posts this rank's call and waits until all ranks posted a matching call.
    pub(super) fn enter(
        &self,
        rank: usize,
        seq: u64,
        post: Post,
        timeout: Duration,
        build_split: impl FnOnce(&[Post]) -> Vec<(Arc<Group>, usize)>,
    ) -> Result<Arc<Round>, CommError> {
        let op = post.desc.kind.name();
        let start = Instant::now();
        // `None`: a timeout too large to represent waits for ever.
        let deadline = start.checked_add(timeout);
        let mut st = self.state.lock();
        if let Some(f) = &st.failure {
            return Err(failed(op, f, Some(seq)));
        }
        let dropped = dropped_ranks(&st, |_| true);
        if !dropped.is_empty() {
            let error = CommError::PeerDropped { op, rank, dropped };
            return Err(fail(&mut st, &self.cv, Some(seq), error));
        }
        if st.round != seq {
            // Unreachable: without a failure every rank's count of collectives is the group's.
            let error = CommError::InvalidArgument {
                op,
                detail: format!(
                    "rank {rank} is at collective #{seq}, its group at #{}",
                    st.round
                ),
            };
            return Err(fail(&mut st, &self.cv, Some(seq), error));
        }
        if st.posts[rank].is_some() {
            // Unreachable through the public API (`Communicator` is neither Sync nor Clone).
            let error = CommError::InvalidArgument {
                op,
                detail: format!("rank {rank} entered a collective twice concurrently"),
            };
            return Err(fail(&mut st, &self.cv, Some(seq), error));
        }
        let my_round = seq;
        st.posts[rank] = Some(post);
        st.n_posted += 1;

        if st.n_posted == self.size {
            let posts: Vec<Post> = st.posts.iter_mut().filter_map(Option::take).collect();
            st.n_posted = 0;
            let descs: Vec<&OpDesc> = posts.iter().map(|p| &p.desc).collect();
            if let Err(error) = check_match(&descs) {
                return Err(fail(&mut st, &self.cv, Some(seq), error));
            }
            let split_out = if posts[0].desc.kind == OpKind::Split {
                build_split(&posts)
            } else {
                Vec::new()
            };
            let round = Arc::new(Round { posts, split_out });
            st.running = Some(round.clone());
            self.cv.notify_all();
            return Ok(round);
        }

        loop {
            if st.round == my_round {
                if let Some(r) = &st.running {
                    return Ok(r.clone());
                }
            }
            if let Some(f) = &st.failure {
                let error = failed(op, f, Some(my_round));
                withdraw(&mut st, rank);
                return Err(error);
            }
            let dropped = dropped_ranks(&st, |r| st.posts[r].is_none());
            if !dropped.is_empty() {
                withdraw(&mut st, rank);
                let error = CommError::PeerDropped { op, rank, dropped };
                return Err(fail(&mut st, &self.cv, Some(seq), error));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                withdraw(&mut st, rank);
                let missing = (0..self.size).filter(|&r| r != rank && st.posts[r].is_none());
                let error = CommError::Timeout {
                    op,
                    rank,
                    missing: missing.collect(),
                    world_size: self.size,
                    waited: start.elapsed(),
                    timeout,
                };
                return Err(fail(&mut st, &self.cv, Some(seq), error));
            }
            wait(&self.cv, &mut st, deadline);
        }
    }

    /// A barrier among the ranks executing the running round; `last` ends the round.
    ///
    /// No timeout on purpose: see the module doc (every rank that posted reaches every stage).
    pub(super) fn stage(&self, last: bool) {
        let mut st = self.state.lock();
        let gen = st.stage_gen;
        st.stage_arrived += 1;
        if st.stage_arrived == self.size {
            st.stage_arrived = 0;
            st.stage_gen += 1;
            if last {
                st.running = None;
                st.round += 1;
            }
            self.cv.notify_all();
            return;
        }
        while st.stage_gen == gen {
            self.cv.wait(&mut st);
        }
    }

    /// Records a failure found by one rank alone (bad arguments): peers fail fast instead of
    /// waiting for a collective this rank will never join.
    /// `seq` is the rank's collective count (`None` for point-to-point calls).
    pub(super) fn fail_local(&self, seq: Option<u64>, error: CommError) -> CommError {
        let mut st = self.state.lock();
        // `fail` keeps the first cause; this rank still learns what it did wrong.
        fail(&mut st, &self.cv, seq, error)
    }

    pub(super) fn mark_dropped(&self, rank: usize) {
        let mut st = self.state.lock();
        if let Some(d) = st.dropped.get_mut(rank) {
            *d = true;
        }
        self.cv.notify_all();
    }

    /// Queues a message for `dst` (eager send).
    pub(super) fn push_message(
        &self,
        src: usize,
        dst: usize,
        msg: Message,
    ) -> Result<(), CommError> {
        let op = "send";
        let mut st = self.state.lock();
        if let Some(f) = &st.failure {
            return Err(failed(op, f, None));
        }
        if st.dropped[dst] {
            let error = CommError::PeerDropped {
                op,
                rank: src,
                dropped: vec![dst],
            };
            return Err(fail(&mut st, &self.cv, None, error));
        }
        st.mailboxes[src * self.size + dst].push_back(msg);
        self.cv.notify_all();
        Ok(())
    }

    /// Takes the oldest message from `src` to `dst` and checks it against what `dst` expects.
    pub(super) fn pop_message(
        &self,
        src: usize,
        dst: usize,
        dtype: DType,
        len: usize,
        timeout: Duration,
    ) -> Result<Message, CommError> {
        let op = "recv";
        let start = Instant::now();
        // `None`: a timeout too large to represent waits for ever.
        let deadline = start.checked_add(timeout);
        let mut st = self.state.lock();
        loop {
            if let Some(f) = &st.failure {
                return Err(failed(op, f, None));
            }
            if let Some(msg) = st.mailboxes[src * self.size + dst].pop_front() {
                if msg.dtype != dtype || msg.len != len {
                    let error = CommError::Mismatch {
                        op,
                        detail: format!(
                            "rank {src} sent {} {} elements but rank {dst} receives {len} {dtype}",
                            msg.len, msg.dtype
                        ),
                    };
                    return Err(fail(&mut st, &self.cv, None, error));
                }
                return Ok(msg);
            }
            if st.dropped[src] {
                let error = CommError::PeerDropped {
                    op,
                    rank: dst,
                    dropped: vec![src],
                };
                return Err(fail(&mut st, &self.cv, None, error));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let error = CommError::Timeout {
                    op,
                    rank: dst,
                    missing: vec![src],
                    world_size: self.size,
                    waited: start.elapsed(),
                    timeout,
                };
                return Err(fail(&mut st, &self.cv, None, error));
            }
            wait(&self.cv, &mut st, deadline);
        }
    }
}

/// The collective in which the failure happened fails with the failure itself; every later
/// call (and every point-to-point call) with `Poisoned`.
fn failed(op: &'static str, f: &Failure, seq: Option<u64>) -> CommError {
    if seq.is_some() && f.round == seq {
        f.error.clone()
    } else {
        CommError::Poisoned {
            op,
            cause: f.error.to_string(),
        }
    }
}

fn dropped_ranks(st: &State, filter: impl Fn(usize) -> bool) -> Vec<usize> {
    (0..st.dropped.len())
        .filter(|&r| st.dropped[r] && filter(r))
        .collect()
}

fn withdraw(st: &mut State, rank: usize) {
    if st.posts[rank].take().is_some() {
        st.n_posted -= 1;
    }
}

fn wait(cv: &Condvar, st: &mut MutexGuard<'_, State>, deadline: Option<Instant>) {
    match deadline {
        Some(d) => {
            cv.wait_until(st, d);
        }
        None => cv.wait(st),
    }
}

/// Poisons the group with `error` (the first failure wins) and wakes every waiter.
fn fail(st: &mut State, cv: &Condvar, round: Option<u64>, error: CommError) -> CommError {
    if st.failure.is_none() {
        st.failure = Some(Failure {
            round,
            error: error.clone(),
        });
    }
    cv.notify_all();
    error
}
