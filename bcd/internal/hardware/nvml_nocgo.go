//go:build !cgo

package hardware

// OpenSystemGPUs is the machine's GPUs; this bcd was built without cgo, which go-nvml needs.
func OpenSystemGPUs() (GPUs, error) {
	return NoGPUs{Why: "this bcd was built without cgo, so without NVML: rebuild with CGO_ENABLED=1"}, nil
}
