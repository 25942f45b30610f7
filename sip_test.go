package idem

import "testing"

// The test vectors of the SipHash paper (appendix A) and its reference
// implementation: key 00 01 .. 0f, messages 00 01 .. (n-1).
func TestSipHash24Vectors(t *testing.T) {
	const k0, k1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908
	msg := make([]byte, 16)
	for i := range msg {
		msg[i] = byte(i)
	}
	for _, c := range []struct {
		n    int
		want uint64
	}{
		{0, 0x726fdb47dd0e0e31},
		{15, 0xa129ca6149be45e5},
	} {
		if got := sipHash24(k0, k1, string(msg[:c.n])); got != c.want {
			t.Errorf("SipHash-2-4 of %d bytes = %#x; want %#x", c.n, got, c.want)
		}
	}
}
