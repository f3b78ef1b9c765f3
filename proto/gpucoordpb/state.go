package gpucoordpb

// Terminal reports whether a job in state s has ended: succeeded, failed or
// cancelled. A nil state has not.
func Terminal(s *JobState) bool {
	switch s.GetPhase() {
	case JobState_SUCCEEDED, JobState_FAILED, JobState_CANCELLED:
		return true
	}
	return false
}
