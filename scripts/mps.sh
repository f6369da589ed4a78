# Sourced by the GPU scripts: start and stop an MPS control daemon (the kernels of
# several processes on one GPU then share it, instead of taking turns by time slice).
#   mps_start [LOG]   0 when the daemon runs; its output goes to LOG (default: stderr)
#   mps_stop          stops it and forgets its directories
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if [ -n "${1:-}" ]; then
    nvidia-cuda-mps-control -d >> "$1" 2>&1
  else
    nvidia-cuda-mps-control -d
  fi
}

mps_stop() {
  echo quit | timeout 20 nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
