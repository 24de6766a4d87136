//! Data pipeline: Tekken tokenizer, Mistral template, Pixtral images, truncation filter,
//! packing (in progress: see the data issue).
