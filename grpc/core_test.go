package idemgrpc

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem/middleware/rpccode"
	"github.com/idemgo/idem/middleware/rpccore"
)

// The names the tests used before the RPC core held what they test.

func storeKey(scope, key string) string { return rpccore.StoreKey(scope, key) }

func retried(c codes.Code) bool { return rpccode.Retried(c) }

func encodeRecord(flags byte, header, trailer metadata.MD, replay []string, name string, body []byte) []byte {
	return rpccore.EncodeRecord(flags, rpccore.Metadata(header), rpccore.Metadata(trailer), replay, name, body)
}

type record struct {
	*rpccore.Record
	header, trailer metadata.MD
}

func decodeRecord(b []byte, replay []string) (*record, error) {
	r, err := rpccore.DecodeRecord(b, replay)
	if err != nil {
		return nil, err
	}
	return &record{r, metadata.MD(r.Header), metadata.MD(r.Trailer)}, nil
}

// errRecord is a record that does not decode.
var errRecord = rpccore.ErrRecord

// message decodes the recorded response message, as a replay does.
func (r *record) message() (proto.Message, error) {
	m, err := frame.Proto.Decode(r.Name, r.Body)
	if err != nil {
		return nil, errors.Join(errRecord, err)
	}
	return m.(proto.Message), nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
