//go:build failover && waitreplicas

package idem_test

import (
	"errors"
	"time"

	"github.com/idemgo/idem"
)

// Built only with the tag waitreplicas (.ci/failover.sh --wait-replicas N),
// so that the experiment compiles on a RedisStore without the option too.
func init() {
	setWaitReplicas = func(o *idem.RedisOptions, n int, timeout time.Duration) {
		o.WaitReplicas, o.WaitTimeout = n, timeout
	}
	notReplicated = func(err error) bool { return errors.Is(err, idem.ErrNotReplicated) }
}
