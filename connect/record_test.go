package idemconnect

import (
	"encoding/hex"
	"errors"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Records written by the gRPC module's interceptor (its encodeRecord,
// fingerprint and storeKey, run once to make these), which this module's
// must equal byte for byte: a service moving between grpc-go and Connect
// keeps its records.
const (
	grpcMessageRecord = "01000107782d6f72646572036f2d370107782d747261636503742d371b676f6f676c652e70726f746f6275662e537472696e6756616c75650a0f6f7264657220372063726561746564"
	grpcStatusRecord  = "01020107782d6f726465720772656675736564000008031217616d6f756e74206d75737420626520706f7369746976651a3c0a28747970652e676f6f676c65617069732e636f6d2f676f6f676c652e7270632e4572726f72496e666f12100a084445434c494e4544120474657374"
	grpcFingerprint   = "f1981a4f037fb3c6650dfdec03739f4d53a9193e39451a3c300cf5caf4a8f4c0"
	grpcStoreKey      = "g14:acme3:k-7"
)

func TestRecordsAreTheGRPCModules(t *testing.T) {
	replay := []string{"x-order", "x-trace"}
	body, _ := proto.Marshal(wrapperspb.String("order 7 created"))
	msg := encodeRecord(0, http.Header{"X-Order": {"o-7"}}, http.Header{"X-Trace": {"t-7"}}, replay, "google.protobuf.StringValue", body)
	if got := hex.EncodeToString(msg); got != grpcMessageRecord {
		t.Errorf("message record = %s; want the gRPC module's %s", got, grpcMessageRecord)
	}
	d, _ := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: "DECLINED", Domain: "test"})
	stat := encodeRecord(flagStatus, http.Header{"X-Order": {"refused"}}, nil, replay, "", encodeStatus(connect.CodeInvalidArgument, "amount must be positive", []*connect.ErrorDetail{d}))
	if got := hex.EncodeToString(stat); got != grpcStatusRecord {
		t.Errorf("status record = %s; want the gRPC module's %s", got, grpcStatusRecord)
	}
	fp, _ := fingerprint(procCreate, wrapperspb.String("7"))
	if got := hex.EncodeToString(fp); got != grpcFingerprint {
		t.Errorf("fingerprint = %s; want the gRPC module's %s", got, grpcFingerprint)
	}
	if got := storeKey("acme", "k-7"); got != grpcStoreKey {
		t.Errorf("storeKey = %q; want the gRPC module's %q", got, grpcStoreKey)
	}

	// The gRPC module's records read back here.
	b, _ := hex.DecodeString(grpcMessageRecord)
	r, err := decodeRecord(b, replay)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.message()
	if err != nil || m.(*wrapperspb.StringValue).GetValue() != "order 7 created" || r.header.Get("X-Order") != "o-7" || r.trailer.Get("X-Trace") != "t-7" {
		t.Errorf("decoded %v %v, header %v, trailer %v; want the message, X-Order and X-Trace", m, err, r.header, r.trailer)
	}
	b, _ = hex.DecodeString(grpcStatusRecord)
	if r, err = decodeRecord(b, replay); err != nil {
		t.Fatal(err)
	}
	ce, err := r.status()
	if err != nil || ce.Code() != connect.CodeInvalidArgument || ce.Message() != "amount must be positive" || r.header.Get("X-Order") != "refused" {
		t.Fatalf("decoded status %v %v, header %v; want InvalidArgument, its message and X-Order", ce, err, r.header)
	}
	if reason, _ := errorInfo(ce); reason != "DECLINED" {
		t.Errorf("decoded status's ErrorInfo reason = %q; want DECLINED", reason)
	}
}

// A record that does not decode is errRecord, never a panic. (A record
// cut at a protobuf field's boundary may still decode: that is protobuf's,
// as in the gRPC module.)
func TestRecordDamaged(t *testing.T) {
	for _, golden := range []string{grpcStatusRecord, grpcMessageRecord} {
		good, _ := hex.DecodeString(golden)
		failed := 0
		for i := range good {
			r, err := decodeRecord(good[:i], []string{"x-order"})
			if err == nil && r.flags&flagStatus != 0 {
				_, err = r.status()
			} else if err == nil {
				_, err = r.message()
			}
			if err != nil {
				failed++
				if !errors.Is(err, errRecord) {
					t.Errorf("decode of the record cut at %d = %v; want errRecord", i, err)
				}
			}
		}
		if failed < len(good)/2 {
			t.Errorf("%d of %d cuts of a record failed to decode; want most", failed, len(good))
		}
	}
	for _, b := range [][]byte{nil, {2, 0}, {1, 3}, {1, 4}} {
		if _, err := decodeRecord(b, nil); !errors.Is(err, errRecord) {
			t.Errorf("decodeRecord(%x) = %v; want errRecord", b, err)
		}
	}
}
