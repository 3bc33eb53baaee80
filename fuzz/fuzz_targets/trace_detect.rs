#![no_main]
use libfuzzer_sys::fuzz_target;
#[allow(unused_imports)]
use nvwc_trace::Format;

fuzz_target!(|data: &[u8]| nvwc_fuzz::trace::check_trace(data, None));
