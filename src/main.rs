#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start: a background thread returns freed
/// pages to the OS within a second, so RSS follows the working set instead
/// of the high-water mark of the last burst.
#[repr(transparent)]
pub struct MallocConf(*const std::ffi::c_char);
// SAFETY: the pointer is to a static, immutable C string.
unsafe impl Sync for MallocConf {}

#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: MallocConf =
    MallocConf(c"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

fn main() -> std::process::ExitCode {
    rollcall::cli::main()
}
