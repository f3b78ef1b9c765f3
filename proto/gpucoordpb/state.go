package gpucoordpb

// Terminal reports whether s is an end a job never leaves: SUCCEEDED,
// FAILED or CANCELLED. A nil state is not terminal. It is the one
// definition of a finished job on both sides of the wire.
func Terminal(s *JobState) bool {
	switch s.GetPhase() {
	case JobState_SUCCEEDED, JobState_FAILED, JobState_CANCELLED:
		return true
	}
	return false
}
