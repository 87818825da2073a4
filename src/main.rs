fn main() -> std::process::ExitCode {
    rollcall::cli::main()
}
