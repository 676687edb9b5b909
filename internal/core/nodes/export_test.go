package nodes

// PollQuery is the poll's statement, for its plan to be checked.
const PollQuery = pollQuery
