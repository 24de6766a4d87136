//! Emulated HCCL with ranks as threads of the test process (each with its own device, stream
//! and sockets; nothing else shared): every collective against a sequential reference, and the
//! failures: dead and hung peers, ranks that disagree, bad arguments.

use super::transport::{Timeouts, TEST_TIMEOUTS};
use super::*;
use crate::stream::{Stream, STREAMS};
use cannon_sys::acl::{ACL_ERROR_RT_SOCKET_CLOSE, ACL_ERROR_RT_TASK_TIMEOUT};
use cannon_sys::hccl::{
    aclrtStream, HcclComm, HcclResult, HcclRootInfo, HCCL_DATA_TYPE_BFP16, HCCL_DATA_TYPE_FP32,
    HCCL_DATA_TYPE_INT32, HCCL_DATA_TYPE_UINT32, HCCL_E_NOT_SUPPORT, HCCL_E_PARA, HCCL_E_PTR,
    HCCL_E_TCP_TRANSFER, HCCL_E_TIMEOUT, HCCL_REDUCE_MAX, HCCL_REDUCE_PROD, HCCL_REDUCE_SUM,
    HCCL_SUCCESS,
};
use std::ffi::c_void;
use std::time::{Duration, Instant};

const LONG: Timeouts = Timeouts {
    connect: Duration::from_secs(30),
    exec: Duration::from_secs(30),
};

/// One rank of a test world.
struct Rank {
    rank: u32,
    comm: HcclComm,
    stream: usize,
}

impl Rank {
    fn s(&self) -> aclrtStream {
        self.stream as aclrtStream
    }

    fn sync(&self) -> Result<(), crate::EmuError> {
        STREAMS
            .get(self.stream)
            .unwrap()
            .synchronize(None)
            .map(|_| ())
    }

    fn async_error(&self) -> HcclResult {
        let mut e = HCCL_SUCCESS;
        // SAFETY: live comm, host out-pointer.
        assert_eq!(
            unsafe { HcclGetCommAsyncError(self.comm, &mut e) },
            HCCL_SUCCESS
        );
        e
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        // SAFETY: our own comm (may be destroyed already: then a recorded error, ignored).
        unsafe { HcclCommDestroy(self.comm) };
        let _ = STREAMS.remove(self.stream);
    }
}

fn root_info() -> HcclRootInfo {
    std::thread::spawn(|| {
        crate::device::set_current(0);
        let mut info = HcclRootInfo {
            internal: [0; 4108],
        };
        // SAFETY: host out-pointer.
        assert_eq!(unsafe { HcclGetRootInfo(&mut info) }, HCCL_SUCCESS);
        info
    })
    .join()
    .unwrap()
}

/// Runs `f` on `n` ranks (threads, rank r on device r) of one fresh communicator.
fn world<R: Send>(n: u32, t: Timeouts, f: impl Fn(&Rank) -> R + Sync) -> Vec<R> {
    let info = root_info();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (f, info) = (&f, &info);
                s.spawn(move || {
                    crate::device::set_current(r);
                    TEST_TIMEOUTS.with(|c| c.set(Some(t)));
                    let mut comm: HcclComm = std::ptr::null_mut();
                    // SAFETY: valid root info and out-pointer.
                    let code = unsafe { HcclCommInitRootInfo(n, info, r, &mut comm) };
                    assert_eq!(code, HCCL_SUCCESS, "{:?}", crate::error::take_recent());
                    let stream = STREAMS.insert(Stream::new(r).unwrap());
                    f(&Rank {
                        rank: r,
                        comm,
                        stream,
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Device memory of `r` holding `v`'s bytes.
fn dev<T: Copy>(r: &Rank, v: &[T]) -> *mut c_void {
    let bytes = std::mem::size_of_val(v).max(1);
    let a = crate::mem::alloc(r.rank, bytes).unwrap();
    let p = crate::mem::resolve(a, bytes).unwrap();
    // SAFETY: `p` is the host backing of a fresh allocation of `bytes` bytes.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr().cast::<u8>(), p, std::mem::size_of_val(v)) };
    a as *mut c_void
}

fn read<T: Copy + Default>(p: *mut c_void, n: usize) -> Vec<T> {
    let mut out = vec![T::default(); n];
    let h = crate::mem::resolve(p as usize, n * std::mem::size_of::<T>()).unwrap();
    // SAFETY: resolved host backing of n T's.
    unsafe {
        std::ptr::copy_nonoverlapping(
            h,
            out.as_mut_ptr().cast::<u8>(),
            n * std::mem::size_of::<T>(),
        )
    };
    out
}

fn input(rank: u32, n: usize) -> Vec<i32> {
    (0..n as i32)
        .map(|i| (rank as i32 + 1) * 100 + i * (rank as i32 - 1))
        .collect()
}

#[test]
fn every_collective_matches_a_sequential_reference() {
    let n = 4u32;
    let len = 6usize;
    let all: Vec<Vec<i32>> = (0..n).map(|r| input(r, len * n as usize)).collect();
    let results = world(n, LONG, |r| {
        let me = r.rank as usize;
        let i32t = HCCL_DATA_TYPE_INT32;
        let mine = &all[me];
        let send = dev(r, mine);
        let mut out = Vec::new();
        // SAFETY (all calls below): device buffers of the sizes HCCL expects, live comm/stream.
        unsafe {
            let ar = dev(r, &vec![0i32; mine.len()]);
            assert_eq!(
                HcclAllReduce(
                    send,
                    ar,
                    mine.len() as u64,
                    i32t,
                    HCCL_REDUCE_SUM,
                    r.comm,
                    r.s()
                ),
                0
            );
            let mx = dev(r, &vec![0i32; mine.len()]);
            assert_eq!(
                HcclAllReduce(
                    send,
                    mx,
                    mine.len() as u64,
                    i32t,
                    HCCL_REDUCE_MAX,
                    r.comm,
                    r.s()
                ),
                0
            );
            let rs = dev(r, &vec![0i32; len]);
            assert_eq!(
                HcclReduceScatter(send, rs, len as u64, i32t, HCCL_REDUCE_SUM, r.comm, r.s()),
                0
            );
            let ag = dev(r, &vec![0i32; len * n as usize]);
            assert_eq!(HcclAllGather(send, ag, len as u64, i32t, r.comm, r.s()), 0);
            let bc = dev(r, mine);
            assert_eq!(
                HcclBroadcast(bc, mine.len() as u64, i32t, 2, r.comm, r.s()),
                0
            );
            let a2a = dev(r, &vec![0i32; mine.len()]);
            assert_eq!(
                HcclAlltoAll(send, len as u64, i32t, a2a, len as u64, i32t, r.comm, r.s()),
                0
            );
            let red = dev(r, &vec![0i32; mine.len()]);
            assert_eq!(
                HcclReduce(
                    send,
                    red,
                    mine.len() as u64,
                    i32t,
                    HCCL_REDUCE_SUM,
                    1,
                    r.comm,
                    r.s()
                ),
                0
            );
            // AlltoAllV: rank i sends j+1 elements to rank j, from offset 5*j.
            let sc: Vec<u64> = (0..n as u64).map(|j| j + 1).collect();
            let sd: Vec<u64> = (0..n as u64).map(|j| 5 * j).collect();
            let rc: Vec<u64> = vec![me as u64 + 1; n as usize];
            let rd: Vec<u64> = (0..n as u64).map(|j| j * (me as u64 + 1)).collect();
            let a2av = dev(r, &vec![0i32; n as usize * (me + 1)]);
            assert_eq!(
                HcclAlltoAllV(
                    send,
                    sc.as_ptr().cast(),
                    sd.as_ptr().cast(),
                    i32t,
                    a2av,
                    rc.as_ptr().cast(),
                    rd.as_ptr().cast(),
                    i32t,
                    r.comm,
                    r.s()
                ),
                0
            );
            // A ring: even ranks send first, odd ranks receive first.
            let next = (r.rank + 1) % n;
            let prev = (r.rank + n - 1) % n;
            let ring = dev(r, &vec![0i32; len]);
            if r.rank % 2 == 0 {
                assert_eq!(HcclSend(send, len as u64, i32t, next, r.comm, r.s()), 0);
                assert_eq!(HcclRecv(ring, len as u64, i32t, prev, r.comm, r.s()), 0);
            } else {
                assert_eq!(HcclRecv(ring, len as u64, i32t, prev, r.comm, r.s()), 0);
                assert_eq!(HcclSend(send, len as u64, i32t, next, r.comm, r.s()), 0);
            }
            assert_eq!(HcclBarrier(r.comm, r.s()), 0);
            r.sync().unwrap();
            for (p, k) in [
                (ar, mine.len()),
                (mx, mine.len()),
                (rs, len),
                (ag, len * n as usize),
                (bc, mine.len()),
                (a2a, mine.len()),
                (red, mine.len()),
                (a2av, n as usize * (me + 1)),
                (ring, len),
            ] {
                out.push(read::<i32>(p, k));
            }
        }
        assert_eq!(r.async_error(), HCCL_SUCCESS);
        out
    });
    let total = len * n as usize;
    let sum: Vec<i32> = (0..total).map(|i| all.iter().map(|v| v[i]).sum()).collect();
    let max: Vec<i32> = (0..total)
        .map(|i| all.iter().map(|v| v[i]).max().unwrap())
        .collect();
    let gathered: Vec<i32> = all.iter().flat_map(|v| v[..len].to_vec()).collect();
    for (me, got) in results.iter().enumerate() {
        assert_eq!(got[0], sum, "allreduce sum, rank {me}");
        assert_eq!(got[1], max, "allreduce max");
        assert_eq!(
            got[2],
            sum[me * len..(me + 1) * len].to_vec(),
            "reduce_scatter"
        );
        assert_eq!(got[3], gathered, "allgather");
        assert_eq!(got[4], all[2], "broadcast from 2");
        let a2a: Vec<i32> = (0..n as usize)
            .flat_map(|j| all[j][me * len..(me + 1) * len].to_vec())
            .collect();
        assert_eq!(got[5], a2a, "alltoall");
        if me == 1 {
            assert_eq!(got[6], sum, "reduce at root 1");
        }
        let a2av: Vec<i32> = (0..n as usize)
            .flat_map(|j| all[j][5 * me..5 * me + me + 1].to_vec())
            .collect();
        assert_eq!(got[7], a2av, "alltoallv");
        let prev = (me + n as usize - 1) % n as usize;
        assert_eq!(got[8], all[prev][..len].to_vec(), "ring send/recv");
    }
}

/// Collectives whose receive buffer is (or lies in) the send buffer, as HCCL allows: the
/// emulator reads its send buffers in place, so these are the cases where reading and writing
/// could overlap. Each result is the out-of-place reference's.
#[test]
fn collectives_in_place_give_the_out_of_place_results() {
    let n = 3u32;
    let len = 5usize;
    let all: Vec<Vec<i32>> = (0..n).map(|r| input(r, len * n as usize)).collect();
    let results = world(n, LONG, |r| {
        let me = r.rank as usize;
        let i32t = HCCL_DATA_TYPE_INT32;
        let mine = &all[me];
        let total = mine.len() as u64;
        // SAFETY (all calls below): device buffers of the sizes HCCL expects, live comm/stream.
        unsafe {
            let ar = dev(r, mine);
            assert_eq!(
                HcclAllReduce(ar, ar, total, i32t, HCCL_REDUCE_SUM, r.comm, r.s()),
                0
            );
            // Reduce-scatter into this rank's own chunk of the send buffer.
            let rs = dev(r, mine);
            let rs_out = (rs as usize + me * len * 4) as *mut c_void;
            assert_eq!(
                HcclReduceScatter(rs, rs_out, len as u64, i32t, HCCL_REDUCE_SUM, r.comm, r.s()),
                0
            );
            // All-gather from this rank's chunk of the receive buffer.
            let ag = dev(r, mine);
            let ag_in = (ag as usize + me * len * 4) as *mut c_void;
            assert_eq!(HcclAllGather(ag_in, ag, len as u64, i32t, r.comm, r.s()), 0);
            let a2a = dev(r, mine);
            assert_eq!(
                HcclAlltoAll(a2a, len as u64, i32t, a2a, len as u64, i32t, r.comm, r.s()),
                0
            );
            r.sync().unwrap();
            vec![
                read::<i32>(ar, mine.len()),
                read::<i32>(rs_out, len),
                read::<i32>(ag, mine.len()),
                read::<i32>(a2a, mine.len()),
            ]
        }
    });
    let total = len * n as usize;
    let sum: Vec<i32> = (0..total).map(|i| all.iter().map(|v| v[i]).sum()).collect();
    for (me, got) in results.iter().enumerate() {
        assert_eq!(got[0], sum, "allreduce in place, rank {me}");
        assert_eq!(
            got[1],
            sum[me * len..(me + 1) * len].to_vec(),
            "reduce_scatter"
        );
        let gathered: Vec<i32> = (0..n as usize)
            .flat_map(|j| all[j][j * len..(j + 1) * len].to_vec())
            .collect();
        assert_eq!(got[2], gathered, "allgather in place");
        let a2a: Vec<i32> = (0..n as usize)
            .flat_map(|j| all[j][me * len..(me + 1) * len].to_vec())
            .collect();
        assert_eq!(got[3], a2a, "alltoall in place");
    }
}

#[test]
fn a_destroyed_peer_is_an_error_on_the_others_at_once() {
    let t = Instant::now();
    let codes = world(3, LONG, |r| {
        let x = dev(r, &[1.0f32; 8]);
        if r.rank == 2 {
            // SAFETY: our comm; the Drop's second destroy is a recorded error.
            assert_eq!(unsafe { HcclCommDestroy(r.comm) }, 0);
            return None;
        }
        // SAFETY: device buffer of 8 f32, live comm/stream.
        let c =
            unsafe { HcclAllReduce(x, x, 8, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, r.comm, r.s()) };
        assert_eq!(c, 0, "queued fine; the failure is asynchronous");
        let e = r.sync().unwrap_err();
        // Rank 2 is gone; whichever survivor fails first then leaves too, so the other may
        // name either as the closed peer.
        assert!(e.message.contains("closed its connection"), "{e}");
        let again =
            unsafe { HcclAllReduce(x, x, 8, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, r.comm, r.s()) };
        assert_eq!(again, 0);
        let poisoned = r.sync().unwrap_err();
        assert!(poisoned.message.contains("failed earlier"), "{poisoned}");
        Some((e.code, r.async_error()))
    });
    for c in codes.into_iter().flatten() {
        assert_eq!(c, (ACL_ERROR_RT_SOCKET_CLOSE, HCCL_E_TCP_TRANSFER));
    }
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "not a timeout: {:?}",
        t.elapsed()
    );
}

#[test]
fn a_hung_peer_is_a_timeout_not_a_hang() {
    let short = Timeouts {
        connect: Duration::from_secs(30),
        exec: Duration::from_millis(300),
    };
    let out = world(2, short, |r| {
        let x = dev(r, &[1i32; 4]);
        if r.rank == 1 {
            // Stays alive (sockets open) but never calls: only the timeout can end rank 0's wait.
            std::thread::sleep(Duration::from_millis(1500));
            return None;
        }
        let t = Instant::now();
        // SAFETY: device buffer of 4 i32, live comm/stream.
        unsafe {
            HcclAllReduce(
                x,
                x,
                4,
                HCCL_DATA_TYPE_INT32,
                HCCL_REDUCE_SUM,
                r.comm,
                r.s(),
            )
        };
        let e = r.sync().unwrap_err();
        Some((e.code, r.async_error(), t.elapsed(), e.message))
    });
    let (code, hccl, waited, msg) = out.into_iter().flatten().next().unwrap();
    assert_eq!(
        (code, hccl),
        (ACL_ERROR_RT_TASK_TIMEOUT, HCCL_E_TIMEOUT),
        "{msg}"
    );
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(1),
        "{waited:?}"
    );
    assert!(msg.contains("HCCL_EXEC_TIMEOUT"), "{msg}");
}

#[test]
fn ranks_that_disagree_fail_together() {
    let out = world(2, LONG, |r| {
        let count = 4 + r.rank as u64;
        let x = dev(r, &vec![0i32; count as usize]);
        // SAFETY: device buffer of `count` i32.
        unsafe {
            HcclAllReduce(
                x,
                x,
                count,
                HCCL_DATA_TYPE_INT32,
                HCCL_REDUCE_SUM,
                r.comm,
                r.s(),
            )
        };
        let e = r.sync().unwrap_err();
        (r.async_error(), e.message)
    });
    for (code, msg) in out {
        assert_eq!(code, HCCL_E_PARA);
        assert!(
            msg.contains("ranks disagree") && msg.contains("count 5"),
            "{msg}"
        );
    }
}

#[test]
fn arguments_are_checked_as_hccl_does() {
    world(2, LONG, |r| {
        let x = dev(r, &[0.0f32; 4]);
        let host = [0.0f32; 4];
        let hp = host.as_ptr() as *mut c_void;
        let f32t = HCCL_DATA_TYPE_FP32;
        let recent = || crate::error::take_recent().unwrap_or_default();
        // SAFETY: every call is expected to be rejected before touching memory.
        unsafe {
            assert_eq!(
                HcclAllReduce(std::ptr::null_mut(), x, 4, f32t, 0, r.comm, r.s()),
                HCCL_E_PTR
            );
            assert_eq!(
                HcclAllReduce(x, x, 4, f32t, 0, std::ptr::null_mut(), r.s()),
                HCCL_E_PTR
            );
            assert_eq!(
                HcclAllReduce(x, x, 4, f32t, 0, r.comm, std::ptr::null_mut()),
                HCCL_E_PTR
            );
            assert_eq!(HcclAllReduce(hp, x, 4, f32t, 0, r.comm, r.s()), HCCL_E_PARA);
            assert!(recent().contains("not device memory"));
            assert_eq!(HcclAllReduce(x, x, 5, f32t, 0, r.comm, r.s()), HCCL_E_PARA);
            assert!(recent().contains("must hold 20 bytes"));
            assert_eq!(
                HcclAllReduce(
                    x,
                    x,
                    2,
                    HCCL_DATA_TYPE_BFP16,
                    HCCL_REDUCE_PROD,
                    r.comm,
                    r.s()
                ),
                HCCL_E_NOT_SUPPORT
            );
            assert_eq!(
                HcclAllReduce(x, x, 4, HCCL_DATA_TYPE_UINT32, 0, r.comm, r.s()),
                HCCL_E_NOT_SUPPORT
            );
            assert_eq!(HcclAllReduce(x, x, 4, f32t, 7, r.comm, r.s()), HCCL_E_PARA);
            assert_eq!(HcclBroadcast(x, 4, f32t, 2, r.comm, r.s()), HCCL_E_PARA);
            assert_eq!(HcclSend(x, 4, f32t, r.rank, r.comm, r.s()), HCCL_E_PARA);
            assert_eq!(
                HcclAllGather(x, x, 4, f32t, r.comm, r.s()),
                HCCL_E_PARA,
                "recv needs 2 * 4"
            );
            assert_eq!(
                HcclAlltoAll(x, 2, f32t, x, 2, HCCL_DATA_TYPE_INT32, r.comm, r.s()),
                HCCL_E_PARA
            );
            // A buffer of another device, and a stream of another device.
            let other = crate::mem::alloc(5, 16).unwrap() as *mut c_void;
            assert_eq!(
                HcclAllReduce(other, x, 4, f32t, 0, r.comm, r.s()),
                HCCL_E_PARA
            );
            assert!(recent().contains("is on device 5"));
            let s5 = STREAMS.insert(Stream::new(5).unwrap());
            assert_eq!(
                HcclAllReduce(x, x, 4, f32t, 0, r.comm, s5 as aclrtStream),
                HCCL_E_PARA
            );
            assert!(recent().contains("stream is on device 5"));
            let mut size = 0u32;
            assert_eq!(HcclGetRankSize(r.comm, &mut size), 0);
            assert_eq!(size, 2);
            assert_eq!(HcclGetRankSize(r.comm, std::ptr::null_mut()), HCCL_E_PTR);
            let _ = STREAMS.remove(s5);
            crate::mem::free(other as usize).unwrap();
            let s = std::ffi::CStr::from_ptr(HcclGetErrorString(HCCL_E_TIMEOUT));
            assert!(s.to_str().unwrap().starts_with("HCCL_E_TIMEOUT"));
        }
        // Nothing was queued by the rejected calls: the next collective still pairs up.
        // SAFETY: device buffer of 4 f32.
        unsafe { assert_eq!(HcclAllReduce(x, x, 4, f32t, 0, r.comm, r.s()), 0) };
        r.sync().unwrap();
    });
}

#[test]
fn init_checks_the_group() {
    // nRanks disagree: rank 1 believes in a group of 3.
    let info = root_info();
    let codes: Vec<HcclResult> = std::thread::scope(|s| {
        let hs: Vec<_> = [(0u32, 2u32), (1, 3)]
            .into_iter()
            .map(|(rank, n)| {
                let info = &info;
                s.spawn(move || {
                    crate::device::set_current(rank);
                    TEST_TIMEOUTS.with(|c| c.set(Some(LONG)));
                    let mut comm: HcclComm = std::ptr::null_mut();
                    // SAFETY: valid pointers.
                    unsafe { HcclCommInitRootInfo(n, info, rank, &mut comm) }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(codes, vec![HCCL_E_PARA, HCCL_E_PARA]);

    // Rank 1 never comes: rank 0 gives up after HCCL_CONNECT_TIMEOUT.
    let info = root_info();
    let t = Instant::now();
    let code = std::thread::spawn(move || {
        crate::device::set_current(0);
        TEST_TIMEOUTS.with(|c| {
            c.set(Some(Timeouts {
                connect: Duration::from_millis(300),
                exec: Duration::from_secs(1),
            }))
        });
        let mut comm: HcclComm = std::ptr::null_mut();
        // SAFETY: valid pointers.
        let code = unsafe { HcclCommInitRootInfo(2, &info, 0, &mut comm) };
        (code, crate::error::take_recent().unwrap_or_default())
    })
    .join()
    .unwrap();
    assert_eq!(code.0, HCCL_E_TIMEOUT, "{}", code.1);
    assert!(code.1.contains("rank(s) [1] did not join"), "{}", code.1);
    assert!(t.elapsed() < Duration::from_secs(5));

    // Bad arguments.
    let mut comm: HcclComm = std::ptr::null_mut();
    let junk = HcclRootInfo {
        internal: [0; 4108],
    };
    crate::device::set_current(0);
    // SAFETY: valid pointers (the root info is garbage on purpose).
    unsafe {
        assert_eq!(HcclCommInitRootInfo(2, &junk, 0, &mut comm), HCCL_E_PARA);
        assert_eq!(HcclCommInitRootInfo(2, &junk, 2, &mut comm), HCCL_E_PARA);
        assert_eq!(HcclCommInitRootInfo(0, &junk, 0, &mut comm), HCCL_E_PARA);
        assert_eq!(
            HcclCommInitRootInfo(2, std::ptr::null(), 0, &mut comm),
            HCCL_E_PTR
        );
    }
}
