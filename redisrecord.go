package idem

import "strconv"

// The parts of a Redis record (format in scripts/record.lua) that the client
// builds: it knows them before the call, and a byte copied here is a byte
// Redis, which every client shares, does not have to assemble.

// claimTail is a claim's value after "1C<token>:":
// <#owner>:<owner><#attempt>:<attempt><fingerprint>.
func claimTail(owner string, attempt, fingerprint []byte) []byte {
	b := make([]byte, 0, len(owner)+len(attempt)+len(fingerprint)+8)
	b = appendField(b, owner)
	b = strconv.AppendInt(b, int64(len(attempt)), 10)
	b = append(b, ':')
	b = append(b, attempt...)
	return append(b, fingerprint...)
}

// heldPrefix is how the live claim of a lease begins:
// 1C<token>:<#owner>:<owner>.
func heldPrefix(l *Lease) []byte {
	return appendHeld(make([]byte, 0, 24+len(l.Owner)), l)
}

// appendHeld appends heldPrefix(l) to b.
func appendHeld(b []byte, l *Lease) []byte {
	b = append(b, "1C"...)
	b = strconv.AppendInt(b, l.Token, 10)
	b = append(b, ':')
	return appendField(b, l.Owner)
}

// appendDone appends a confirmation:
// 1D<token>:<#fingerprint>:<fingerprint><result>.
func appendDone(b []byte, l *Lease, result []byte) []byte {
	b = append(b, "1D"...)
	b = strconv.AppendInt(b, l.Token, 10)
	b = append(b, ':')
	b = appendField(b, string(l.Fingerprint))
	return append(b, result...)
}

// appendField appends s length-prefixed: <#s>:<s>.
func appendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}
