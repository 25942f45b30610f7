package idemconnect

import (
	"context"
	"errors"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem/middleware/rpccore"
)

// The names the tests used before the RPC core held what they test.

const flagStatus = rpccore.FlagStatus

func storeKey(scope, key string) string { return rpccore.StoreKey(scope, key) }

func fingerprint(procedure string, m proto.Message) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return rpccore.Fingerprint(procedure, b), err
}

func encodeRecord(flags byte, header, trailer http.Header, replay []string, name string, body []byte) []byte {
	return rpccore.EncodeRecord(flags, rpccore.Metadata(header), rpccore.Metadata(trailer), replay, name, body)
}

func encodeStatus(code connect.Code, msg string, details []*connect.ErrorDetail) []byte {
	st := rpccore.Status{Code: rpccore.Code(code), Message: msg}
	for _, d := range details {
		st.Details = append(st.Details, rpccore.Detail{TypeURL: rpccore.TypeURLPrefix + d.Type(), Value: d.Bytes()})
	}
	return st.Encode()
}

type record struct {
	*rpccore.Record
	flags           byte
	header, trailer http.Header
}

func decodeRecord(b []byte, replay []string) (*record, error) {
	canon := make([]string, len(replay))
	for i, k := range replay {
		canon[i] = http.CanonicalHeaderKey(k)
	}
	r, err := rpccore.DecodeRecord(b, canon)
	if err != nil {
		return nil, err
	}
	return &record{r, r.Flags, http.Header(r.Header), http.Header(r.Trailer)}, nil
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

func (r *record) status() (*connect.Error, error) {
	st, err := rpccore.ParseStatus(r.Body)
	if err != nil {
		return nil, err
	}
	return frame.Error(st).(*connect.Error), nil
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
