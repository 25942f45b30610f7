//go:build unix

package bench

import (
	"syscall"
	"time"
)

// processCPU returns the user and system CPU time this process has used so
// far; ok is false where the system cannot say.
func processCPU() (d time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
