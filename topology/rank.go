package topology

// Rank is a global rank: a process's index in the whole job, 0..world-1.
type Rank int

// Coord is a rank's position in the parallel grid.
type Coord struct {
	TP int `json:"tp"` // tensor-parallel rank inside its TP group
	PP int `json:"pp"` // pipeline stage
	DP int `json:"dp"` // data-parallel replica
}
