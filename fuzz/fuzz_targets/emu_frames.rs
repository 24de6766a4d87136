#![no_main]
// The CANN emulator's wire (bootstrap HELLO, rank table, collective frames): what any process
// reaching an emulated rank's port may send. Replayed on stable by emu/tests/fuzz_wire.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    cannon_cann_emu::hccl::parse_wire(data);
});
