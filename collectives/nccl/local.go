package nccl

import "fmt"

// EnvHostID is the environment variable NCCL takes a host's identity from
// (by default NCCL derives it from the host name and boot id). NCCL refuses
// two ranks of one host on one GPU ("Duplicate GPU detected") and treats
// ranks with different ids as on different hosts.
const EnvHostID = "NCCL_HOSTID"

// Devices loads NCCL and the CUDA runtime that cfg names and returns the
// number of visible CUDA devices. It creates no communicator: it is a
// launcher's pre-flight check, which fails at once with an error wrapping
// ErrUnavailable (naming the library and the reason, on one line) instead of
// starting ranks that would each fail.
func Devices(cfg *Config) (int, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	lib, err := loadLibrary(cfg.NCCLLibrary, cfg.CUDARTLibraries)
	if err != nil {
		return 0, err
	}
	return lib.devices()
}

// PlaceLocal places rank among the ranks a launcher starts on one machine
// with devices visible CUDA devices: on device rank mod devices, in a
// process whose NCCL_HOSTID (EnvHostID) is host/k with k = rank div devices.
// Ranks that share a GPU thus differ in host id, which NCCL needs to accept
// them (verified with NCCL 2.28, several processes on one H100); ranks on
// different GPUs of the machine share one, so that NCCL still connects them
// through NVLink or PCIe rather than its network transport. host names the
// machine (its host name), so that ids differ between machines.
func PlaceLocal(rank, devices int, host string) (device int, hostID string) {
	devices = max(devices, 1)
	return rank % devices, fmt.Sprintf("%s/%d", host, rank/devices)
}
