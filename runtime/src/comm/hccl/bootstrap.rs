//! Creating HCCL communicators: the root-info bootstrap over the rendezvous (TCP store or
//! file), and group splits (each subgroup bootstraps its own communicator the same way).

use std::cell::Cell;
use std::time::Duration;

use cannon_sys::hccl;

use super::handle::{check, runtime, HcclCommunicator};
use crate::buffer::DeviceBuffer;
use crate::comm::error::{CommError, CommResult};
use crate::comm::rendezvous::{DistEnv, Rendezvous};
use crate::stream::Stream;

/// `HCCL_ROOT_INFO_BYTES`.
const ROOT_INFO_BYTES: usize = hccl::HCCL_ROOT_INFO_BYTES as usize;

impl HcclCommunicator {
    /// torchrun-style start: RANK/WORLD_SIZE/LOCAL_RANK and the rendezvous (CANNON_RDZV_DIR,
    /// else MASTER_ADDR/MASTER_PORT) from the environment, one process per NPU, this process on
    /// NPU `LOCAL_RANK`.
    /// `timeout` bounds the wait for rank 0's root info (here and in later splits).
    pub(crate) fn from_env(timeout: Duration) -> CommResult<Self> {
        let env = DistEnv::from_env()?;
        let rdzv = Rendezvous::from_env(&env, timeout)?;
        Self::init(
            env.rank,
            env.world_size,
            env.local_rank as u32,
            rdzv,
            timeout,
        )
    }

    /// Rank 0 creates the root info and publishes it; every rank then joins with
    /// HcclCommInitRootInfo, which returns once all ranks joined. Rank 0 removes the published
    /// root info then.
    pub(crate) fn init(
        rank: usize,
        world_size: usize,
        ordinal: u32,
        rdzv: Rendezvous,
        timeout: Duration,
    ) -> CommResult<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(CommError::InvalidRank {
                op: "HcclCommunicator::init",
                rank,
                world_size,
            });
        }
        crate::npu::bind(ordinal).map_err(runtime("HcclCommunicator::init (bind)"))?;
        let mut root = hccl::HcclRootInfo {
            internal: [0; ROOT_INFO_BYTES],
        };
        if rank == 0 {
            // SAFETY: valid out-pointer to a HcclRootInfo; the device is bound.
            check("HcclGetRootInfo", unsafe {
                hccl::HcclGetRootInfo(&mut root)
            })?;
            let bytes: Vec<u8> = root.internal.iter().map(|&c| c as u8).collect();
            rdzv.publish(world_size, &bytes)?;
        } else {
            let bytes = rdzv.wait(world_size, ROOT_INFO_BYTES, timeout)?;
            for (dst, b) in root.internal.iter_mut().zip(bytes) {
                *dst = b as std::ffi::c_char;
            }
        }
        let mut raw: hccl::HcclComm = std::ptr::null_mut();
        // SAFETY: valid root info and out-pointer; identical nRanks/rootInfo on every rank.
        check("HcclCommInitRootInfo", unsafe {
            hccl::HcclCommInitRootInfo(world_size as u32, &root, rank as u32, &mut raw)
        })?;
        let comm = HcclCommunicator {
            raw,
            rank,
            world_size,
            ordinal,
            rdzv,
            timeout: Cell::new(timeout),
            splits: Cell::new(0),
        };
        if rank == 0 {
            // Init is collective: every rank has read the file by now.
            comm.rdzv.remove()?;
        }
        Ok(comm)
    }

    /// Splits like `MPI_Comm_split` (and the CPU communicator): ranks with the same `color`
    /// form a group ordered by `(key, rank)`. Collective over this communicator: the colors
    /// and keys are all-gathered on `stream`, then each new group bootstraps from its first
    /// member's root info through a child of this communicator's rendezvous.
    pub(crate) fn split(
        &self,
        color: u32,
        key: u32,
        stream: &Stream,
    ) -> CommResult<HcclCommunicator> {
        let what = "split";
        let err = runtime(what);
        let mine =
            DeviceBuffer::<i64>::clone_htod(stream, &[color as i64, key as i64]).map_err(&err)?;
        let mut all = DeviceBuffer::<i64>::alloc(stream, 2 * self.world_size).map_err(&err)?;
        self.all_gather(&mine.view(), &mut all.view_mut(), stream)?;
        let all = all.clone_dtoh(stream).map_err(&err)?;

        let mut members: Vec<(i64, usize)> = (0..self.world_size)
            .filter(|&r| all[2 * r] == color as i64)
            .map(|r| (all[2 * r + 1], r))
            .collect();
        members.sort_unstable();
        let new_rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .ok_or_else(|| CommError::Mismatch {
                op: what,
                detail: format!("rank {} is missing from its own color {color}", self.rank),
            })?;

        let n = self.splits.get();
        self.splits.set(n + 1);
        let rdzv = self.rdzv.child(&format!("split{n}.color{color}"))?;
        HcclCommunicator::init(new_rank, members.len(), self.ordinal, rdzv, self.timeout())
    }
}
