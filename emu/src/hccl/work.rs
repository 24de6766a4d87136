//! What a queued collective is: its operation code (carried in frames, so a receiver can
//! name what its peer called) and its work, with its buffers as device addresses.

/// Operation codes carried in frames (so a receiver can name what its peer called).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    AllReduce = 1,
    Broadcast,
    ReduceScatter,
    AllGather,
    AlltoAll,
    AlltoAllV,
    Reduce,
    Barrier,
    Send,
}

impl Op {
    pub fn name(code: u32) -> &'static str {
        match code {
            1 => "HcclAllReduce",
            2 => "HcclBroadcast",
            3 => "HcclReduceScatter",
            4 => "HcclAllGather",
            5 => "HcclAlltoAll",
            6 => "HcclAlltoAllV",
            7 => "HcclReduce",
            8 => "HcclBarrier",
            9 => "HcclSend",
            _ => "an unknown call",
        }
    }
}

/// What a queued collective does, with its buffers as device addresses.
#[derive(Debug, Clone)]
pub enum Work {
    AllReduce {
        send: usize,
        recv: usize,
        bytes: usize,
    },
    Reduce {
        send: usize,
        recv: usize,
        bytes: usize,
        root: u32,
    },
    Broadcast {
        buf: usize,
        bytes: usize,
        root: u32,
    },
    ReduceScatter {
        send: usize,
        recv: usize,
        chunk: usize,
    },
    AllGather {
        send: usize,
        recv: usize,
        chunk: usize,
    },
    AlltoAll {
        send: usize,
        recv: usize,
        chunk: usize,
    },
    /// Byte offsets and lengths per peer.
    AlltoAllV {
        send: usize,
        send_parts: Vec<(usize, usize)>,
        recv: usize,
        recv_parts: Vec<(usize, usize)>,
        elem: usize,
    },
    Barrier,
    Send {
        buf: usize,
        bytes: usize,
        peer: u32,
    },
    Recv {
        buf: usize,
        bytes: usize,
        peer: u32,
    },
}
